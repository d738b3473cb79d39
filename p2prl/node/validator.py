"""The validator: sync weights, check announced rollout batches, publish signed verdicts and scores.

It keeps the weights of the last few versions (``keep_states``) so a batch made one or two versions
ago is checked against the model that made it, and loads them into its one model object on demand.
Announcements wait (bounded) until the validator holds their version; anything older than the
staleness bound or never reachable is answered with a soft reject, not silence.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from p2prl.node.common import generation_params, group_size, groups_per_batch, open_synced_role, task_of
from p2prl.node.context import NodeContext
from p2prl.node.sync import WeightSync
from p2prl.node.weights import Weights, sha256_of_state
from p2prl.protocol.messages import PatchManifest, RolloutAnnouncement

log = logging.getLogger(__name__)

QUEUE_MAX = 256  # announcements waiting to be checked
WAIT_FOR_VERSION_S = 60.0  # how long an announcement from the future waits for our sync
SCORES_EVERY_S = 5.0
ROLLOUT_FETCH_S = 20.0  # a batch its miner cannot serve soon is not worth blocking the checks for
CHECKED_BLOBS = 8192  # blob ids already judged: a repeated announcement is dropped, not re-checked
POSITION_TAG = b"p2prl/validator/position-secret/v1"


def position_secret(identity: Any) -> bytes:
    """The secret that picks checked positions: the validator's signature over a fixed tag.

    Ed25519 signatures are deterministic, so it is the same after a restart (a miner cannot wait
    for new positions by forcing one), and nobody without the validator's key can compute it.
    """
    return bytes(identity.sign(POSITION_TAG))


class VersionCache:
    """The last few versions' weights, and which one is loaded in the engine's model."""

    def __init__(self, engine: Any, keep: int) -> None:
        self.engine = engine
        self.keep = keep
        self.states: OrderedDict[int, Weights] = OrderedDict()
        self.loaded: int | None = None
        self._lock = threading.Lock()

    def add(self, w: Weights) -> None:
        with self._lock:
            self.states[w.version] = w
            while len(self.states) > self.keep:
                self.states.popitem(last=False)

    def newest(self) -> int:
        with self._lock:
            return max(self.states) if self.states else -1

    def source(self, version: int) -> tuple[str, Any] | None:
        """The RolloutValidator's VersionSource: (manifest hash, model) with that version loaded."""
        with self._lock:
            w = self.states.get(version)
        if w is None or not w.hash:
            return None
        if self.loaded != version:
            self.engine.load_state_dict(w.state)
            self.loaded = version
        return w.hash, self.engine.model


def calibrated(model: Any, tok: Any, task: Any, gen: Any, manifest_hash: str, vcfg: Any) -> Any:
    """``vcfg`` with tolerances from this engine's own honest drift (KV-cache generation at two batch
    sizes against the full forward), so a miner on the same engine with other or perturbed weights
    fails where the loose defaults would let a small perturbation through."""
    from p2prl.proof.calibrate import calibrate

    t0 = time.monotonic()
    cfg, drift = calibrate(model, tok, task, gen, manifest_hash, vcfg)
    log.info(
        "tolerances calibrated in %.1f s: fingerprint %.4f (rollout %.4f), logprob %.4f / %.4f; drift %s",
        time.monotonic() - t0,
        cfg.fingerprint_tol,
        cfg.fingerprint_tol_rollout,
        cfg.logprob_tol_mean,
        cfg.logprob_tol_max,
        {k: round(v, 5) for k, v in drift.items()},
    )
    return cfg


class Validator:
    def __init__(self, ctx: NodeContext) -> None:
        from p2prl.proof.validate import RolloutValidator, ValidatorConfig

        self.ctx = ctx
        role = open_synced_role(ctx, "validator")
        self.dir, self.book, self.engine, tok = role.dir, role.book, role.engine, role.tok
        start = role.start
        self.cache = VersionCache(self.engine, max(ctx.config.keep_states, int(ctx.g.max_staleness) + 1))
        self.cache.add(start)
        self.sync = WeightSync(ctx, self.book, start, role.weights_dir, consecutive=True)
        gen = generation_params(ctx)
        vcfg = ValidatorConfig(
            max_staleness=int(ctx.g.max_staleness),
            temperature=gen.temperature,
            top_p=gen.top_p,
            max_new_tokens=gen.max_new_tokens,
            group_size=group_size(ctx),
            groups_per_batch=groups_per_batch(ctx),
            checked_per_group=ctx.config.checked_per_group,
        )
        if ctx.config.calibrate_tolerances:
            vcfg = calibrated(self.engine.model, tok, task_of(ctx), gen, start.hash, vcfg)
        self.checker = RolloutValidator(
            self.cache.source, tok, task_of(ctx), vcfg, position_secret=position_secret(ctx.identity)
        )
        self.checked: OrderedDict[str, None] = OrderedDict()
        self.scores = _make_scores(ctx)
        self.queue: queue.Queue[tuple[float, Any]] = queue.Queue(QUEUE_MAX)
        self.waiting: deque[tuple[float, Any]] = deque()
        self._last_scores = 0.0
        self.current = start
        ctx.status.set(
            version=start.version, weights_hash=start.hash, weights_sha256=sha256_of_state(start.state)
        )

    # -- pump thread ----------------------------------------------------------------------
    def on_manifest(self, item: Any) -> None:
        try:
            self.book.add(item.envelope.raw)
        except ValueError as e:
            self.ctx.status.incr_label("dropped", "manifest")
            log.warning("manifest dropped: %s", e)

    def on_announcement(self, item: Any) -> None:
        try:
            self.queue.put_nowait((time.monotonic(), item))
        except queue.Full:
            self.ctx.status.incr_label("dropped", "validator_queue_full")

    # -- work loop --------------------------------------------------------------------------
    def run(self) -> None:
        ctx = self.ctx
        while not ctx.stop.is_set():
            for w in self.sync.take_all_staged():
                self.cache.add(w)
                self.current = w
                ctx.status.set(weights_sha256=sha256_of_state(w.state))
            self._maybe_publish_scores()
            item = self._next()
            if item is None:
                continue
            try:
                self.check(item)
            except Exception:
                log.exception("checking an announcement failed")
                ctx.status.incr_label("check_failed", "exception")

    def _next(self) -> Any:
        """The next announcement whose version we hold (or that can no longer become checkable)."""
        now = time.monotonic()
        while True:
            try:
                self.waiting.append(self.queue.get_nowait())
            except queue.Empty:
                break
            if len(self.waiting) > QUEUE_MAX:
                self.waiting.popleft()
                self.ctx.status.incr_label("dropped", "validator_queue_full")
        cur = self.current.version
        for _ in range(len(self.waiting)):
            t, item = self.waiting.popleft()
            ann: RolloutAnnouncement = item.message
            if ann.version <= cur or now - t > WAIT_FOR_VERSION_S:
                return item
            self.waiting.append((t, item))
        try:
            self.waiting.append(self.queue.get(timeout=0.5))
        except queue.Empty:
            pass
        return None

    def check(self, item: Any) -> Any:
        """Fetch the batch, judge it, publish the verdict; returns the BatchVerdict (None: a repeat).

        A blob is judged once: the checker records each prompt index it has seen, so judging the
        same blob again (a re-gossiped or replayed announcement) would fail it as
        ``duplicate_index`` and zero an honest miner.
        """
        from p2prl.proof.validate import BLOB_MISMATCH, to_verdict

        ctx = self.ctx
        ann: RolloutAnnouncement = item.message
        miner = item.envelope.signer
        if ann.blob.id in self.checked:
            ctx.status.incr_label("dropped", "duplicate_announcement")
            return None
        t0 = time.monotonic()
        ctx.net.add_provider_hint(ann.blob.id, getattr(item, "origin", item.from_peer))
        try:
            ctx.net.fetch(ann.blob, timeout=min(ctx.config.fetch_timeout_s, ROLLOUT_FETCH_S), s3=False)
            data = ctx.store.get(ann.blob.id)
        except Exception as e:
            log.warning("rollout blob %s unavailable: %s", ann.blob.id[:12], e)
            from p2prl.proof.validate import _all

            bv = _all(ann.groups, BLOB_MISMATCH)
            data = None
        if data is not None:
            self.checked[ann.blob.id] = None
            while len(self.checked) > CHECKED_BLOBS:
                self.checked.popitem(last=False)
            bv = self.checker.check(ann, miner, data, self.current.version)
        verdict = to_verdict(bv, ann, miner)
        ctx.publish("verdicts", verdict)
        self._record(ann, miner, bv, time.monotonic() - t0)
        return bv

    def _record(self, ann: RolloutAnnouncement, miner: bytes, bv: Any, secs: float) -> None:
        st = self.ctx.status
        acc = sum(1 for g in bv.groups if g.accepted)
        st.incr("batches_checked")
        st.incr("groups_accepted", acc)
        st.incr("groups_rejected", len(bv.groups) - acc)
        st.incr("rollouts_accepted", sum(len(g.rollouts) for g in bv.valid_groups))
        st.incr("rollouts_rejected", (len(bv.groups) - acc) * group_size(self.ctx))
        for g in bv.groups:
            if not g.accepted:
                st.incr_label("rejected", g.reason)
        st.gauge("check_ms", secs * 1000)
        total = sum(r.reward for grp in bv.valid_groups for r in grp.rollouts)
        count = sum(len(grp.rollouts) for grp in bv.valid_groups)
        st.add_reward(ann.version, total, count)
        self.scores.record(miner.hex(), ann.version, int(bv.unique_rollouts), bool(bv.hard_failure))
        st.set_scores(self.scores.scores(self.current.version))
        log.info(
            "verdict %s v%d from %s: %d/%d groups accepted %s",
            ann.blob.id[:12],
            ann.version,
            miner.hex()[:12],
            acc,
            len(bv.groups),
            bv.reasons(),
        )

    def _maybe_publish_scores(self) -> None:
        now = time.monotonic()
        if now - self._last_scores < SCORES_EVERY_S:
            return
        self._last_scores = now
        scores = self.scores.scores(self.current.version)
        if scores:
            self.ctx.publish("verdicts", self.scores.to_message(self.current.version))

    def holds(self) -> list[str]:
        return [m.blob.id for m in self.book.all()[-8:] if self.ctx.store.has(m.blob.id)]

    def start(self) -> None:
        self.ctx.spawn_pump(
            {PatchManifest.TYPE: self.on_manifest, RolloutAnnouncement.TYPE: self.on_announcement},
            self.holds,
            lambda: self.current.version,
        )
        self.ctx.spawn("sync", self.sync.run)
        self.ctx.spawn("validate", self.run)


def _make_scores(ctx: NodeContext) -> Any:
    from p2prl.proof.scores import ScoreBook

    return ScoreBook(ctx.config.score_window)
