"""The miner: sync weights, generate rollout groups on derived prompts, commit, sign, announce.

Threads: the message pump (manifests in, verdicts for our own counters), the sync thread (stages
the next version), and the generation loop, which switches to a staged version only between
batches. A batch follows the trainer's receipt of one of its earlier batches when it has one (its
prompts and uniforms seeded by ``chain_seed``, numbered 0, 1, …: ``chains.Chains``); else it is a
chain start, whose prompts are numbered per version 0, 1, 2, … (``derive_seed(manifest hash, key,
index)``) with the next index persisted, so a restart never re-announces a prompt it already used.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from p2prl.atomicfile import write_atomic
from p2prl.net import Incoming
from p2prl.node.miner.chains import Chains
from p2prl.node.miner.rejectlog import RejectionLog
from p2prl.node.runtime.pump import Handlers
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.runtime.task import generation_params, task_of
from p2prl.node.setup.settings import MinerSettings
from p2prl.node.weights.start import open_synced_role
from p2prl.node.weights.sync import WeightSync
from p2prl.node.weights.version import Weights
from p2prl.proof import build_batch, commitment_root, encode_batch, sample_keys
from p2prl.protocol import (
    PatchManifest,
    Receipts,
    RolloutAnnouncement,
    Scores,
    Verdict,
    blob_ref_for,
    chain_seed,
)
from p2prl.rl import derive_seed

log = logging.getLogger(__name__)

IDLE_REFILL_S = 5.0  # after its per-version quota, a miner adds a batch this often until a new version
KEEP_ROLLOUT_BLOBS = 32  # our announced batches kept pinned for validators and the trainer to fetch


class Miner:
    def __init__(self, env: RoleEnv[MinerSettings], *, share_weights: bool = True) -> None:
        """``share_weights``: the engine's model holds the version's tensors (one copy); False keeps
        them apart, for an engine that runs other weights than the version held."""
        self.env = env
        role = open_synced_role(env, "miner", share=share_weights, engine_state=self.engine_state)
        self.dir, self.book, self.host, self.tok = role.dir, role.book, role.host, role.tok
        self.engine = self.host.engine
        self.task = task_of(env)
        self.sync = WeightSync(env, self.book, self.host)
        self.pinned: deque[str] = deque()
        self.batches = 0
        self._last_batch = 0.0
        self._index_file = self.dir / "next_index.json"
        self._rejections = RejectionLog(local_network=env.settings.local_network)
        self.chains = Chains(env.identity.public_key, self.dir / "chains.json")
        self._made: dict[int, int] = {}  # version -> batches announced on it by this process

    # -- state ------------------------------------------------------------------
    # The weights the engine generates with for a version; None: the version's own (the host then
    # writes each switch's changed elements straight into an engine that keeps its own copy). Only a
    # benchmark's adversary sets it (bench/dishonest.py).
    engine_state: Callable[[Weights], dict[str, torch.Tensor]] | None = None

    @property
    def active(self) -> Weights:
        """The version the engine generates with (the host's current one)."""
        return self.host.current

    def _next_index(self, version: int) -> int:
        try:
            d = json.loads(self._index_file.read_text())
            if int(d["version"]) == version:
                return int(d["next"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return 0

    def _made_at(self, version: int) -> int:
        """Batches made on ``version``: counted here, and for chain starts also from the persisted
        prompt index (a restart does not make the version's quota again)."""
        starts = self._next_index(version) // self.env.g.generation.groups_per_batch
        return max(starts, self._made.get(version, 0))

    def _save_index(self, version: int, nxt: int) -> None:
        write_atomic(self._index_file, json.dumps({"version": version, "next": nxt}).encode())

    def manifest_hash(self, w: Weights) -> str:
        """The public seed of a version: its manifest's result hash (version 0: the genesis base hash)."""
        assert w.hash is not None, "run() generates only from verified weights"
        return w.hash

    # -- handlers (pump thread) -------------------------------------------------------
    def on_verdict(self, item: Incoming[Verdict]) -> None:
        v = item.message
        if v.miner != self.env.identity.public_hex:
            return
        self.env.status.incr("groups_accepted", v.accepted)
        self.env.status.incr("groups_rejected", len(v.groups) - v.accepted)
        for g in v.groups:
            if not g.accepted:
                self.env.status.incr_label("rejected", g.reason)
        self._rejections.add(v.version, [g.reason for g in v.groups if not g.accepted])

    def on_scores(self, item: Incoming[Scores]) -> None:
        me = self.env.identity.public_hex
        if me in item.message.scores:  # scores come in parts and omit zeros
            self.env.status.gauge("own_score", item.message.scores[me])

    # -- generation loop ----------------------------------------------------------------
    def run(self) -> None:
        """The generation loop: switch between batches, then do what :func:`next_step` decides."""
        env = self.env
        while not env.stop.is_set():
            done = self.host.switch()
            if done:
                log.info("switched to v%d", done[-1].version)
            step = next_step(
                batches=self.batches,
                max_batches=env.settings.max_batches,
                made=self._made_at(self.active.version),
                per_version=env.settings.batches_per_version,
                idle_s=time.monotonic() - self._last_batch,
                verified=self.active.verified,
                behind=self.sync.target_version() - self.active.version,
                max_staleness=int(env.g.max_staleness),
            )
            if step.wait_s:
                if step.state:
                    env.status.set(sync_state=step.state)
                env.stop.wait(step.wait_s)
                continue
            try:
                self.produce_batch()
            except Exception:
                log.exception("batch failed")
                env.status.incr_label("batch_failed", "exception")
                env.stop.wait(2.0)

    def produce_batch(self) -> RolloutAnnouncement | None:
        """Generate, score, commit and announce one batch on the active version (None: dropped, the
        version it was made with failed its hash after the switch). It follows the oldest receipt in
        hand, which goes back to the chains if the batch is not announced (its chain goes on)."""
        slot = self.chains.take()  # the receipt this batch follows; None: a chain start
        sent: list[bool] = []  # set once the announcement is out: its receipt is used then
        try:
            return self._produce(slot, sent)
        finally:
            if slot is not None and not sent:
                self.chains.give_back(slot)

    def _produce(self, slot: tuple[str, str] | None, sent: list[bool]) -> RolloutAnnouncement | None:
        env, w = self.env, self.active
        mhash = self.manifest_hash(w)
        key = env.identity.public_key
        n_groups, g_size = env.g.generation.groups_per_batch, env.g.generation.group_size
        if slot is not None:
            seed = chain_seed(slot[1], slot[0])
            indices = list(range(n_groups))
        else:
            seed = mhash
            first = self._next_index(w.version)
            self._save_index(w.version, first + n_groups)  # reserve before use: a crash never reuses
            indices = list(range(first, first + n_groups))
        problems = [self.task.problem(derive_seed(seed, key, i)) for i in indices]
        prompts = [self.tok.encode_prompt(p.prompt) for p in problems]
        t0 = time.monotonic()
        engine_seed = int.from_bytes(derive_seed(seed, key, indices[0])[:4], "big")
        keys = sample_keys(seed, key, indices, g_size)
        samples = self.engine.generate(prompts, g_size, generation_params(env, engine_seed), keys)
        gen_s = time.monotonic() - t0
        groups, total, count, tokens = [], 0.0, 0, 0
        for i, p, ids, ss in zip(indices, problems, prompts, samples, strict=True):
            rewards = [self.task.reward(p, self.tok.decode(s.completion_ids)) for s in ss]
            total += sum(rewards)
            count += len(rewards)
            tokens += sum(len(s.completion_ids) for s in ss)
            groups.append((i, ids, ss, rewards))
        if not self.host.settled(w):  # made with a version that did not hash as promised: never sent
            env.status.incr_label("batch_failed", "weights_unconfirmed")
            log.warning("batch of v%d dropped: the version did not hash to its manifest's result hash", w.version)
            return None
        batch = build_batch(w.version, mhash, key, groups, seed=seed if slot is not None else "")
        data = encode_batch(batch)
        chunk = env.g.patch.chunk_size
        ref = blob_ref_for(data, chunk_size=max(16 * 1024, min(chunk, 16 * 1024 * 1024)))
        env.store.put(data, expected_id=ref.id)
        env.store.pin([ref.id])
        self.pinned.append(ref.id)
        while len(self.pinned) > KEEP_ROLLOUT_BLOBS:
            env.store.unpin([self.pinned.popleft()])
        env.net.serve(ref)
        ann = RolloutAnnouncement(
            version=w.version,
            manifest_hash=mhash,
            blob=ref,
            groups=len(groups),
            commitment_root=commitment_root(batch),
            prev=slot[0] if slot is not None else "",
            receipts=slot[1] if slot is not None else "",
        )
        self.chains.announced(ref.id)  # before it is sent: the receipt may come back at once
        sent.append(True)
        env.publish("rollouts", ann)
        self.batches += 1
        self._made[w.version] = self._made.get(w.version, 0) + 1
        for v in [v for v in self._made if v < w.version - 8]:
            del self._made[v]
        env.status.incr_label("batches", "chained" if slot is not None else "chain_start")
        self._last_batch = time.monotonic()
        st = env.status
        st.incr("groups_produced", len(groups))
        st.incr("rollouts_produced", count)
        st.incr("batches_announced")
        st.add_reward(w.version, total, count)
        st.gauge("tokens_per_s", tokens / max(gen_s, 1e-6))
        st.gauge("batch_bytes", len(data))
        log.info(
            "announced %d groups at v%d (%d bytes, reward %.3f)",
            len(groups),
            w.version,
            len(data),
            total / max(count, 1),
        )
        return ann

    def holds(self) -> list[str]:
        return list(self.pinned) + [m.blob.id for m in self.book.all()[-8:] if self.env.store.has(m.blob.id)]

    def head(self) -> int:
        return self.active.version

    def handlers(self) -> Handlers:
        return (
            Handlers()
            .on(PatchManifest, self.sync.on_manifest)
            .on(Receipts, self.chains.on_receipts)
            .on(Verdict, self.on_verdict)
            .on(Scores, self.on_scores)
        )

    def loops(self) -> dict[str, Callable[[], None]]:
        return {"sync": self.sync.run, "generate": self.run}

    def pause(self) -> None:
        """Nothing to pause: a miner's batches are its only output, and they are bounded per version."""

    def close(self) -> None:
        """The newest version saved (saves are spaced while running)."""
        self.host.close()


@dataclass(frozen=True)
class Step:
    """What the generation loop does next: make a batch (``wait_s`` 0), or wait, reporting ``state``."""

    wait_s: float = 0.0
    state: str = ""


def next_step(
    *,
    batches: int,
    max_batches: int,
    made: int,
    per_version: int,
    idle_s: float,
    verified: bool,
    behind: int,
    max_staleness: int,
) -> Step:
    """The miner's decision between batches, from numbers only (no I/O, no clock).

    ``made``: batches already made on the active version; ``behind``: versions between the
    trainer's newest and the active one. A miner with its per-version quota waits for the next
    version, adding a batch every ``IDLE_REFILL_S`` in case the trainer needs more; one on
    unverified weights or beyond the staleness bound makes nothing anyone would accept.
    """
    if max_batches and batches >= max_batches:
        return Step(1.0)
    if per_version and made >= per_version and made % per_version == 0 and idle_s < IDLE_REFILL_S:
        return Step(0.2, "waiting")
    if not verified or behind > max_staleness:
        return Step(0.5, "behind")
    return Step()
