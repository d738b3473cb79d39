"""The trainer's intake loop: announcements and verdicts in, accepted groups into the replay buffer.

The pump thread hands it announcements and the genesis validators' verdicts (held and decided by
``admission.Intake``: per signer, bounded; a hard failure from any one validator vetoes); each held
announcement is receipted in the next list the receipts thread signs (``receipts.ReceiptBook``); the
fetch threads take each released blob that follows its own receipt of an accepted batch (a chained
batch: docs/PROTOCOL.md §14; a chain start is trained by nobody) from the swarm, decode it strictly
and put the accepted groups into the buffer (a blob is consumed once, whatever the number of verdicts).

A key with a hard failure loses its training share, not only its score: a veto from any genesis
validator, or a rollout the learner's own token check rejected (``rl.verify``: its tokens do not
follow their public uniforms), bars the key (``bar``) for ``BAR_VERSIONS`` versions: its groups
leave the buffer and its later blobs are not used (``barred_rollouts``).

Receipts sent and used, decisions and bars are kept in ``chains.jsonl`` in the trainer's directory
(``chainlog.ChainLog``), so a restarted trainer trains each miner's next batch on the receipt it
sent before the restart, and a barred key stays barred.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from p2prl.lru import LRU
from p2prl.net import Incoming
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.admission import Intake
from p2prl.node.trainer.chainlog import ChainLog, ChainState
from p2prl.node.trainer.receipts import KEPT, RECEIPTS_S, ReceiptBook
from p2prl.proof import decode_batch, rollout_group
from p2prl.protocol import RolloutAnnouncement, Verdict, chain_seed
from p2prl.reasons import HARD_FAILURES, NodeDrop
from p2prl.rl import ReplayBuffer, RolloutGroup

log = logging.getLogger(__name__)

FETCH_QUEUE = 256
FETCH_THREADS = 4
BAR_VERSIONS = 8  # as long as a hard failure zeroes a validator's score window
MAX_BARRED = 1 << 16
CHAINS_FILE = "chains.jsonl"


def batch_to_groups(
    data: bytes, accepted: set[int], miner_hex: str, version: int, seed: str = ""
) -> list[RolloutGroup]:
    """The accepted groups of a rollout blob as RolloutGroups (strict decoder; header must match;
    ``seed``: a chained batch's, whose uniforms the learner's token check follows)."""
    batch = decode_batch(data)
    if batch.version != version or batch.miner.hex() != miner_hex:
        raise ValueError("batch header does not match its announcement")
    batch.seed = seed
    return [rollout_group(batch, gi) for gi in range(len(batch.groups)) if gi in accepted]


class RolloutIntake:
    """Pump handlers (``on_announcement``, ``on_verdict``) and the fetch loop (``run``).

    ``buffer`` (under ``buffer_lock``) receives the accepted groups; ``version`` is the trainer's
    current version, against which a released blob's staleness is judged once more after the wait.
    """

    def __init__(
        self,
        env: RoleEnv[TrainerSettings],
        buffer: ReplayBuffer,
        buffer_lock: threading.Lock,
        version: Callable[[], int],
    ) -> None:
        self.env = env
        self.buffer = buffer
        self.buffer_lock = buffer_lock
        self.version = version
        self.policy = Intake(len(env.genesis.validator_keys), HARD_FAILURES)
        self.lock = threading.Lock()
        self.fetch_q: queue.Queue[tuple[RolloutAnnouncement, str, set[int], str]] = queue.Queue(FETCH_QUEUE)
        self.chainlog = ChainLog(env.data_dir / "trainer" / CHAINS_FILE)
        kept = self.chainlog.load(ChainState(LRU(KEPT), LRU(4 * self.policy.cache), LRU(MAX_BARRED)))
        self.barred = kept.barred  # miner key (hex) -> last version it is barred for
        self.policy.restore(kept.decided)
        self.receipts = ReceiptBook(env.identity, env.network_id, chainlog=self.chainlog)
        self.receipts.restore(kept.sent)

    def _kept(self) -> ChainState:
        """The state ``chainlog`` keeps, copied from its owners."""
        with self.lock:
            decided, barred = self.policy.done.copy(), self.barred.copy()
        return ChainState(self.receipts.sent(), decided, barred)

    def bar(self, miner: str, reason: str) -> None:
        """Bar ``miner`` from training for ``BAR_VERSIONS`` versions: its buffered groups go now."""
        until = self.version() + BAR_VERSIONS
        with self.lock:
            self.barred[miner] = until
        self.chainlog.barred(miner, until)
        with self.buffer_lock:
            dropped = self.buffer.drop_miner(miner)
        self.env.status.incr_label("keys_barred", reason)
        if dropped:
            self.env.status.incr_label("dropped", NodeDrop.BARRED_ROLLOUTS, dropped)
        log.info("miner %s barred from training (%s): %d groups dropped", miner[:12], reason, dropped)

    def is_barred(self, miner: str) -> bool:
        with self.lock:
            until = self.barred.get(miner)
        return until is not None and self.version() <= until

    # -- pump thread ------------------------------------------------------------------------
    def on_announcement(self, item: Incoming[RolloutAnnouncement]) -> None:
        with self.lock:
            why = self.policy.announce(item.envelope.digest.hex(), item.message, item.envelope.signer_hex, item.origin)
            trusted = item.envelope.signer_hex in self.policy.trusted
        if why is None:  # held: its receipt goes in the next list, seeding the key's next batch
            why = self.receipts.add(item.envelope.signer, item.message.blob.id, trusted)
        if why is not None:
            self.env.status.incr_label("dropped", why)

    def on_verdict(self, item: Incoming[Verdict]) -> None:
        v = item.message
        if item.envelope.signer not in self.env.genesis.validator_keys:  # the net layer checks this too
            self.env.status.incr_label("dropped", NodeDrop.VERDICT_SIGNER)
            return
        self.env.status.incr("verdicts_received")
        self.env.net.add_provider_hint(v.blob_id, item.origin)  # it holds the blob
        with self.lock:
            why = self.policy.verdict(item.envelope.signer_hex, v, time.monotonic())
        if why == NodeDrop.VERDICT_VETO:
            self.chainlog.decided(v.miner, v.blob_id, vetoed=True)
            self.env.status.incr("verdict_vetoes")
            self.bar(v.miner, "verdict_veto")
        elif why is not None and why != NodeDrop.VERDICT_AFTER_DECISION:
            self.env.status.incr_label("dropped", why)
        self._release()

    def _release(self) -> None:
        """Queue the blobs the intake has decided to use (pump and fetch threads both call this)."""
        with self.lock:
            jobs = self.policy.ready(time.monotonic())
        for job in jobs:
            self.chainlog.decided(job.miner, job.ann.blob.id, vetoed=False)  # a chained batch may follow it, after a restart too
            try:
                self.fetch_q.put_nowait((job.ann, job.miner, job.accepted, job.origin))
            except queue.Full:
                self.env.status.incr_label("dropped", NodeDrop.FETCH_QUEUE_FULL)

    # -- receipts thread -----------------------------------------------------------------------
    def send_receipts(self) -> None:
        """Every ``RECEIPTS_S``: the pending receipts listed, signed and gossiped, and the lists due
        again (gossip is lossy and miners restart: a lost list stalls the chains it seeds)."""
        env = self.env
        while not env.stop.wait(RECEIPTS_S):
            raw = self.receipts.take()
            if raw is not None:
                env.publish_raw("manifests", raw)
                env.status.incr("receipts_sent")
            for old in self.receipts.due():
                env.publish_raw("manifests", old)
                env.status.incr("receipts_resent")
            if self.chainlog.due():
                self.chainlog.compact(self._kept)
        self.chainlog.close()

    # -- fetch threads -------------------------------------------------------------------------
    def run(self) -> None:
        env = self.env
        while not env.stop.is_set():
            try:
                ann, miner, accepted, origin = self.fetch_q.get(timeout=0.5)
            except queue.Empty:
                self._release()  # blobs whose wait for the other validators' verdicts is over
                continue
            if self.version() - ann.version > int(env.g.max_staleness):
                env.status.incr_label("dropped", NodeDrop.STALE_ROLLOUTS)
                continue
            if not ann.chained:  # a chain start: its key chose its seed
                env.status.incr_label("dropped", NodeDrop.CHAIN_START, len(accepted))
                continue
            with self.lock:
                follows = self.policy.accepted(miner, ann.prev)
            if not (follows and self.receipts.seeds(miner, ann)):
                env.status.incr_label("dropped", NodeDrop.UNCHAINED, len(accepted))
                continue
            try:
                env.fetch_rollouts(ann.blob, origin, timeout=min(env.settings.fetch_timeout_s, 20.0))
                seed = chain_seed(ann.receipts, ann.prev)
                groups = batch_to_groups(env.store.get(ann.blob.id), accepted, miner, ann.version, seed)
            except Exception as e:
                env.status.incr_label("rollout_fetch_failed", type(e).__name__)
                log.warning("rollout blob %s unusable: %s", ann.blob.id[:12], e)
                continue
            with self.lock:  # the pump thread records verdicts meanwhile
                vetoed = self.policy.vetoed(miner, ann.blob.id)
            if vetoed:  # a hard failure arrived during the fetch
                env.status.incr_label("dropped", NodeDrop.VETOED_ROLLOUTS)
                continue
            if self.is_barred(miner):
                env.status.incr_label("dropped", NodeDrop.BARRED_ROLLOUTS, len(groups))
                continue
            with self.buffer_lock:
                for grp in groups:
                    self.buffer.add(grp)
            rewards = [r.reward for g in groups for r in g.rollouts]
            env.status.add_reward(ann.version, sum(rewards), len(rewards))
            env.status.incr("groups_consumed", len(groups))
            env.status.incr("rollouts_consumed", len(rewards))
