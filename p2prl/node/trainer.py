"""The trainer: verified rollouts in, GRPO steps, one signed patch per published version out.

Threads, so training never waits on I/O:

- pump: holds recent announcements (per signer, bounded: ``intake.Intake``) and, on the verdicts
  of the genesis validators (each bound to the announcement it judged; a hard failure from any one
  vetoes), queues the blob for fetching with the group indices accepted;
- fetch: fetches a queued rollout blob from the swarm, decodes it strictly, and puts the accepted
  groups into the replay buffer (a blob is consumed once, whatever the number of verdicts);
- train: samples the buffer, runs a GRPO step, and hands the newest bf16 state to the publisher
  (a one-slot mailbox: if the publisher is busy, a newer state replaces the waiting one);
- publish: encodes the patch (or anchor), signs the manifest, stores and serves the blob, gossips
  the manifest, mirrors to S3, applies retention, and checkpoints the master weights.

A restart resumes the chain where it stopped (the publisher's state is on disk) and the master
weights from the newest checkpoint; the version never goes backwards.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import torch

from p2prl.node.common import base_model, generation_params, publish_model_files, task_of
from p2prl.node.context import NodeContext
from p2prl.node.intake import Intake
from p2prl.node.weights import sha256_of_state
from p2prl.patch.hashing import weights_hash
from p2prl.proof.validate import HARD_FAILURES
from p2prl.protocol.messages import RolloutAnnouncement, Verdict

log = logging.getLogger(__name__)

FETCH_QUEUE = 256
FETCH_THREADS = 4
REANNOUNCE_S = 10.0


class Mailbox:
    """A one-slot handoff where a newer item replaces an older one not yet taken."""

    def __init__(self) -> None:
        self._item: Any = None
        self._cond = threading.Condition()

    def put(self, item: Any) -> None:
        with self._cond:
            self._item = item
            self._cond.notify_all()

    def take(self, timeout: float) -> Any:
        with self._cond:
            if self._item is None:
                self._cond.wait(timeout)
            item, self._item = self._item, None
            return item

    @property
    def empty(self) -> bool:
        with self._cond:
            return self._item is None


def batch_to_groups(data: bytes, accepted: set[int], miner_hex: str, version: int) -> list[Any]:
    """The accepted groups of a rollout blob as RolloutGroups (strict decoder; header must match)."""
    from p2prl.proof.batch import decode_batch
    from p2prl.rl.types import Rollout, RolloutGroup

    batch = decode_batch(data)
    if batch.version != version or batch.miner.hex() != miner_hex:
        raise ValueError("batch header does not match its announcement")
    out = []
    for gi, g in enumerate(batch.groups):
        if gi not in accepted:
            continue
        rolls = [
            Rollout(r.completion_ids.tolist(), r.logprobs.astype(float).tolist(), float(r.reward))
            for r in g.rollouts
        ]
        out.append(RolloutGroup(g.prompt_ids.tolist(), rolls, batch.version, miner_hex))
    return out


class Trainer:
    def __init__(self, ctx: NodeContext) -> None:
        from p2prl.patch.chain import ChainPublisher
        from p2prl.rl.buffer import ReplayBuffer
        from p2prl.rl.distributed import make_learner
        from p2prl.rl.grpo import GRPOConfig

        self.ctx = ctx
        cfg = ctx.config
        self.dir = ctx.data_dir / "trainer"
        self.dir.mkdir(parents=True, exist_ok=True)
        model, self.tok, base, _ = base_model(ctx, strict=True)
        publish_model_files(ctx)
        task_of(ctx)  # rewards come from miners, but a trainer on a task it cannot build stops here
        gkw: dict[str, Any] = {"temperature": generation_params(ctx).temperature}
        if cfg.lr > 0:
            gkw["lr"] = cfg.lr
        # under torchrun: rank 0's handle on the learner sharded over all ranks (p2prl.rl.distributed)
        self.grpo = make_learner(model, GRPOConfig(**gkw), self.tok.pad_id)
        self.ckpt = self.dir / getattr(self.grpo, "checkpoint_name", "checkpoint.pt")
        patch = ctx.g.patch
        self.chain = ChainPublisher(
            self.dir / "chain",
            ctx.identity,
            ctx.network_id,
            anchor_interval=patch.anchor_interval,
            chunk_size=patch.chunk_size,
            keep_versions=cfg.keep_versions,
            store=ctx.store,
        )
        self._base = base  # published as version 0 (an anchor) by the publish thread on a fresh chain
        self.version = self.chain.version if self.chain.version is not None else 0
        self._resume_master()
        self.buffer = ReplayBuffer(max_staleness=int(ctx.g.max_staleness), half_life=1.0)
        self.batch_groups = cfg.train_batch_groups or ctx.g.generation.groups_per_batch
        self.intake = Intake(len(ctx.genesis.validator_keys), HARD_FAILURES)
        self.intake_lock = threading.Lock()
        self.fetch_q: queue.Queue[tuple[RolloutAnnouncement, str, set[int], str]] = queue.Queue(FETCH_QUEUE)
        self.mailbox = Mailbox()
        self.paused = threading.Event()
        self.buffer_lock = threading.Lock()
        self.steps = 0
        self._last_publish = 0.0
        self._unpublished = False  # trained steps not yet handed to the publisher
        self._last_reannounce = 0.0
        ctx.status.set(version=self.version, trainer_version=self.version, sync_state="training")
        self._record_head()

    # -- pump thread ------------------------------------------------------------------------
    def on_announcement(self, item: Any) -> None:
        ann: RolloutAnnouncement = item.message
        origin = getattr(item, "origin", item.from_peer)
        with self.intake_lock:
            why = self.intake.announce(item.envelope.digest.hex(), ann, item.envelope.signer_hex, origin)
        if why is not None:
            self.ctx.status.incr_label("dropped", why)

    def on_verdict(self, item: Any) -> None:
        v: Verdict = item.message
        if item.envelope.signer not in self.ctx.genesis.validator_keys:  # the net layer checks this too
            self.ctx.status.incr_label("dropped", "verdict_signer")
            return
        self.ctx.status.incr("verdicts_received")
        self.ctx.net.add_provider_hint(v.blob_id, getattr(item, "origin", item.from_peer))  # it holds the blob
        with self.intake_lock:
            why = self.intake.verdict(item.envelope.signer_hex, v, time.monotonic())
        if why == "verdict_veto":
            self.ctx.status.incr("verdict_vetoes")
        elif why is not None and why != "verdict_after_decision":
            self.ctx.status.incr_label("dropped", why)
        self._release()

    def _release(self) -> None:
        """Queue the blobs the intake has decided to use (pump and fetch threads both call this)."""
        with self.intake_lock:
            jobs = self.intake.ready(time.monotonic())
        for job in jobs:
            try:
                self.fetch_q.put_nowait((job.ann, job.miner, job.accepted, job.origin))
            except queue.Full:
                self.ctx.status.incr_label("dropped", "fetch_queue_full")

    # -- fetch thread -------------------------------------------------------------------------
    def fetch_loop(self) -> None:
        ctx = self.ctx
        while not ctx.stop.is_set():
            try:
                ann, miner, accepted, origin = self.fetch_q.get(timeout=0.5)
            except queue.Empty:
                self._release()  # blobs whose wait for the other validators' verdicts is over
                continue
            if self.version - ann.version > int(ctx.g.max_staleness):
                ctx.status.incr_label("dropped", "stale_rollouts")
                continue
            try:
                ctx.fetch_rollouts(ann.blob, origin, timeout=min(ctx.config.fetch_timeout_s, 20.0))
                groups = batch_to_groups(ctx.store.get(ann.blob.id), accepted, miner, ann.version)
            except Exception as e:
                ctx.status.incr_label("rollout_fetch_failed", type(e).__name__)
                log.warning("rollout blob %s unusable: %s", ann.blob.id[:12], e)
                continue
            with self.intake_lock:  # the pump thread records verdicts meanwhile
                vetoed = self.intake.vetoed(miner, ann.blob.id)
            if vetoed:  # a hard failure arrived during the fetch
                ctx.status.incr_label("dropped", "vetoed_rollouts")
                continue
            with self.buffer_lock:
                for grp in groups:
                    self.buffer.add(grp)
            rewards = [r.reward for g in groups for r in g.rollouts]
            ctx.status.add_reward(ann.version, sum(rewards), len(rewards))
            ctx.status.incr("groups_consumed", len(groups))
            ctx.status.incr("rollouts_consumed", len(rewards))

    # -- train thread --------------------------------------------------------------------------
    def train_loop(self) -> None:
        ctx = self.ctx
        cfg = ctx.config
        while not ctx.stop.is_set():
            if self.paused.is_set() or (cfg.max_versions and self.version >= cfg.max_versions):
                ctx.stop.wait(0.5)
                continue
            with self.buffer_lock:
                self.buffer.evict(self.version)
                size = len(self.buffer)
                groups = (
                    self.buffer.sample(self.version, self.batch_groups) if size >= self.batch_groups else []
                )
            ctx.status.set(buffer_groups=size)
            if not groups:
                self._offer_state()  # a step held back by min_publish_s must not wait for new data
                ctx.stop.wait(0.05 if self._unpublished else 0.2)
                continue
            for _ in range(cfg.train_epochs):
                if ctx.stop.is_set() or not self._train_step(groups):
                    break

    def _train_step(self, groups: list[Any]) -> bool:
        """One GRPO step on ``groups``; hands the new state to the publisher. False: nothing learned."""
        ctx = self.ctx
        t0 = time.monotonic()
        stats = self.grpo.step(groups)
        self.steps += 1
        ctx.status.incr("train_steps")
        ctx.status.gauge("train_step_ms", (time.monotonic() - t0) * 1000)
        for k in ("loss", "clip_frac", "kl", "grad_norm", "reward_mean"):
            if isinstance(stats.get(k), (int, float)):
                ctx.status.gauge(f"train_{k}", float(stats[k]))
        if stats.get("skipped"):
            ctx.status.incr("train_steps_skipped")  # no group had reward variance: nothing learned
            return False
        self._unpublished = True
        self._offer_state()
        return True

    def _offer_state(self) -> None:
        """Hand the newest trained state to the publisher if it is free and min_publish_s has passed."""
        if not self._unpublished or not self.mailbox.empty:
            return
        if time.monotonic() - self._last_publish < self.ctx.config.min_publish_s:
            return
        self._unpublished = False
        self.mailbox.put(self.grpo.published_state())

    # -- publish thread --------------------------------------------------------------------------
    def publish_loop(self) -> None:
        ctx = self.ctx
        if self.chain.version is None:
            self.publish(self._base)  # version 0: the genesis base model, as an anchor
        self._base = None
        while not ctx.stop.is_set():
            state = self.mailbox.take(timeout=0.5)
            if state is None:
                self._maybe_reannounce()
                continue
            if self.paused.is_set():
                continue
            self.publish(state)

    def publish(self, state: dict[str, torch.Tensor]) -> Any:
        """Publish ``state`` as the next version: sign, store, serve, gossip, mirror, retain, checkpoint."""
        ctx = self.ctx
        t0 = time.monotonic()
        pv = self.chain.publish(state)
        for item in pv.items:  # the chain stored and pinned the blobs in our store
            ctx.net.serve(item.manifest.blob)
            ctx.publish_raw("manifests", item.envelope)
        m = pv.manifest
        self._last_publish = time.monotonic()
        self.version = m.version
        ctx.status.set(version=m.version, trainer_version=m.version, weights_hash=m.result_hash)
        ctx.status.record_hash(m.version, m.result_hash)
        self._record_sha(m.version, state)
        ctx.status.incr("versions_published")
        ctx.status.incr("patch_bytes_total", m.blob.size)
        ctx.status.gauge("patch_last_bytes", m.blob.size)
        ctx.status.gauge("publish_ms", (time.monotonic() - t0) * 1000)
        self._retention()
        for item in pv.items:
            self._mirror(m.version, item.envelope, item.manifest.blob.id, item.blob)
        if m.version % max(1, ctx.config.checkpoint_every) == 0:
            self.grpo.save(self.ckpt)
        log.info("published v%d (%s, %d bytes)", m.version, m.kind, m.blob.size)
        return pv

    def _resume_master(self) -> None:
        """Master weights: the checkpoint if there is one, else the chain's last published weights."""
        if self.ckpt.exists():
            try:
                self.grpo.load(self.ckpt)
                self.ctx.status.incr("restarts_resumed")
                log.info("restored master weights and optimizer from %s", self.ckpt)
                return
            except Exception as e:
                log.warning("checkpoint %s unusable (%s); resuming from the published weights", self.ckpt, e)
        if self.chain.state is not None:
            self.grpo.load_published(self.chain.state)
            self.ctx.status.incr("restarts_resumed")

    def _record_head(self) -> None:
        head = self.chain.state
        if head is not None:
            self.ctx.status.set(weights_hash=weights_hash(head))
            self.ctx.status.record_hash(self.version, weights_hash(head))
            self._record_sha(self.version, head)

    def _record_sha(self, version: int, state: dict[str, torch.Tensor]) -> None:
        sha = sha256_of_state(state)
        self.ctx.status.set(weights_sha256=sha)
        with self.buffer_lock:
            shas = dict(self.ctx.status.get("sha256_by_version") or {})
            shas[str(version)] = sha
            for k in sorted(shas, key=int)[:-64]:
                del shas[k]
        self.ctx.status.set(sha256_by_version=shas)

    def _retention(self) -> None:
        dropped = self.chain.prune()
        if dropped:
            self.ctx.status.incr("blobs_retired", len(dropped))

    def _mirror(self, version: int, envelope: bytes, blob_id: str, blob: bytes) -> None:
        s3 = getattr(self.ctx.net, "s3", None)
        if s3 is None:
            return
        try:
            s3.publish_version(version, envelope, {blob_id: blob})
            self.ctx.status.incr("s3_versions_mirrored")
        except Exception as e:  # S3 is a fallback: an outage must not stop training
            self.ctx.status.incr_label("s3_errors", type(e).__name__)
            log.warning("S3 mirror of v%d failed: %s", version, e)

    def _maybe_reannounce(self) -> None:
        """Gossip is lossy: re-send the newest manifests now and then (peers drop duplicates)."""
        now = time.monotonic()
        if now - self._last_reannounce < REANNOUNCE_S:
            return
        self._last_reannounce = now
        for env in self.recent_envelopes():
            self.ctx.publish_raw("manifests", env)

    def recent_envelopes(self) -> list[bytes]:
        """The newest anchor's manifest and every manifest after it: all a late joiner needs."""
        env = dict(self.chain.envelopes)
        anchors = [v for v, k in env if k == "anchor"]
        floor = max(anchors, default=0)
        return [e for (v, _k), e in sorted(env.items()) if v >= floor][-64:]

    def pause(self) -> None:
        """Stop publishing new versions (keep serving); used to let miners catch up."""
        self.paused.set()
        self.ctx.status.set(paused=True, sync_state="paused")

    def close(self) -> None:
        """Let the train and publish threads finish, then release the other ranks (under torchrun)."""
        for t in self.ctx.threads:
            if t.name in ("p2prl-train", "p2prl-publish"):
                t.join(30.0)
        close = getattr(self.grpo, "close", None)
        if close is not None:
            close()

    def holds(self) -> list[str]:
        return [*(a.id for a in self.ctx.g.assets), *[m.blob.id for m in self.chain.index.all()][-64:]]

    def start(self) -> None:
        self.ctx.spawn_pump(
            {RolloutAnnouncement.TYPE: self.on_announcement, Verdict.TYPE: self.on_verdict},
            self.holds,
            lambda: self.version,
        )
        for i in range(FETCH_THREADS):  # one miner that stops serving must not hold up the others
            self.ctx.spawn(f"fetch{i}", self.fetch_loop)
        self.ctx.spawn("train", self.train_loop)
        self.ctx.spawn("publish", self.publish_loop)
