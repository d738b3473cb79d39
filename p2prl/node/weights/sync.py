"""Weight sync for miners and validators: fetch the next version's patches, hand them to the host.

The sync thread follows the newest trainer-signed manifest: it plans a path (fast path: the next
patches; slow path after a gap, a hash mismatch or from unverified weights: the newest anchor and
the patches after it) and fetches the blobs (peers first, S3 after). A version whose blobs are all
held is ``staged``: handed to the role's :class:`~p2prl.node.weights.host.ModelHost`. A one-delta
plan from the live version is also verified here, against the live weights (node/weights/live.py:
one copy, the engine model's own tensors, only read), while the role generates. The role switches
with :meth:`ModelHost.switch` at a safe point between batches: on its thread each patch not yet
verified is verified, and then the changed elements are written in place, so nothing ever runs on a
half-applied model and the generation pauses only for the writes. The version reached is saved to
disk, so a restart resumes from it.
"""

from __future__ import annotations

import logging
import time

from p2prl.net import Incoming
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.setup.settings import RoleSettings
from p2prl.node.weights.fetching import fetch_while_progressing
from p2prl.node.weights.host import ModelHost, Staged
from p2prl.node.weights.version import Weights
from p2prl.patch import ManifestError, ManifestStore, PatchError, plan_sync
from p2prl.protocol import PatchManifest
from p2prl.reasons import NodeDrop, PatchReason

log = logging.getLogger(__name__)

S3_POLL_S = 5.0
MAX_BACKOFF_S = 10.0


class SyncError(Exception):
    """A sync attempt that failed (missing manifests, a failed fetch, a bad patch)."""


class WeightSync:
    """The sync thread's loop and the pump's manifest handler: plans and fetches, and hands each
    version whose blobs are held to the :class:`ModelHost` (which alone switches the tensors)."""

    def __init__(
        self,
        env: RoleEnv[RoleSettings],
        book: ManifestStore,
        host: ModelHost,
        *,
        consecutive: bool = False,
    ) -> None:
        self.env = env
        self.book = book
        self.host = host
        self.consecutive = consecutive  # stage every version (validators check batches of each)
        self._slow = False
        self._last_s3 = 0.0
        self._failures = 0
        host.listen(self._switched)
        env.status.set(sync_state="synced")

    def on_manifest(self, item: Incoming[PatchManifest]) -> None:
        """Pump handler: a gossiped manifest, kept if the trainer signed it and it conflicts with none held."""
        try:
            self.book.add(item.envelope.raw)
        except ManifestError as e:
            self.env.status.incr_label("dropped", NodeDrop.MANIFEST)
            log.warning("manifest dropped: %s", e)

    def target_version(self) -> int:
        m = self.book.newest()
        return m.version if m else self.host.current.version

    # -- the sync thread ---------------------------------------------------------
    def run(self) -> None:
        env = self.env
        backoff = 0.5
        while not env.stop.is_set():
            self._poll_s3()
            base = self.host.base()
            target = self.book.newest()
            self._set_state()
            if target is None or not _behind(base, target.version):
                self.book.changed.wait(1.0)
                self.book.changed.clear()
                continue
            if self.consecutive and not self._slow and base.verified:
                nxt = self.book.get(base.version + 1, "delta")
                if nxt is not None and nxt.base_hash == base.hash:
                    target = nxt
            try:
                staged = self.advance(base, target)
            except Exception as e:  # a bad patch or a failed fetch never stops the loop
                self._failures += 1
                self._count_failure(e)
                log.warning("sync v%d -> v%d failed: %s", base.version, target.version, e)
                if isinstance(e, (SyncError, PatchError)):
                    self._slow = True  # retry from an anchor: a gap, a bad patch or a hash mismatch
                env.stop.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            backoff = 0.5
            self.host.stage(staged)  # each staged plan starts where the previous one ends
            self._slow = False
            env.status.record_hash(staged.version, target.result_hash)
            self._retain(staged.version)
            self._set_state()

    def _switched(self, done: list[Weights], error: Exception | None) -> None:
        """After the host's switch (the role's thread): a bad patch sends the next sync through an anchor."""
        if error is not None:
            self._count_failure(error)
            self._slow = True
        if done:
            self._set_state()

    def _set_state(self) -> None:
        m = self.book.newest()
        tv = max(m.version if m else 0, self.host.current.version)
        staged = self.host.has_staged()
        cur = self.host.current.version
        if staged:
            state = "staged"
        elif tv > cur:
            state = "slow_path" if self._slow else "fetching"
        else:
            state = "synced"
        self.env.status.set(trainer_version=tv, sync_state=state)

    def _poll_s3(self) -> None:
        """Pick up manifests from the S3 mirror (late joiners, lost gossip); all are verified."""
        s3 = self.env.net.s3
        now = time.monotonic()
        if s3 is None or now - self._last_s3 < S3_POLL_S:
            return
        self._last_s3 = now
        try:
            ready = s3.ready_versions()
        except Exception as e:
            self.env.status.incr_label("s3_errors", type(e).__name__)
            log.debug("s3 listing failed: %s", e)
            return
        have = set(self.book.versions())
        newest = max(ready, default=-1)
        if not _behind(self.host.base(), newest):
            return
        anchor_interval = self.env.g.patch.anchor_interval
        wanted = [v for v in ready if v > newest - 2 * anchor_interval - 1 and v not in have]
        for v in sorted(wanted)[-4 * anchor_interval :]:
            try:
                self.book.add(s3.get_manifest(v))
            except Exception as e:
                self.env.status.incr_label("dropped", NodeDrop.S3_MANIFEST)
                log.warning("s3 manifest v%d rejected: %s", v, e)

    # -- one sync step -----------------------------------------------------------
    def advance(self, base: Weights, target: PatchManifest) -> Staged:
        """Fetch the blobs of a path to ``target`` from ``base`` (or from an anchor: always from
        unverified weights) and check a one-delta path against the live tensors. Returns the version
        it promises (the manifest's result hash) with its plan, for the host to switch to."""
        manifests = self.book.all()
        t0 = time.monotonic()
        have_v, have_h = (None, None) if self._slow or not base.verified else (base.version, base.hash)
        plan = plan_sync(have_v, have_h, manifests, target.version)
        if not plan:
            raise SyncError(f"no path to v{target.version} from v{base.version} with the manifests held")
        if plan[0].kind == "anchor":
            self.env.status.incr("slow_path_syncs")
        for m in plan:
            self._fetch(m)
        self.env.status.gauge("patch_fetch_ms", (time.monotonic() - t0) * 1000)
        t1 = time.monotonic()
        prepared = self.host.prepare(plan, self.env.store.get)  # beside generation: the switch only writes
        if prepared is not None:
            self.env.status.gauge("patch_verify_ms", (time.monotonic() - t1) * 1000)
        return Staged(target.version, target.result_hash, plan, prepared)

    def _count_failure(self, e: BaseException) -> None:
        st = self.env.status
        st.incr("sync_failures")
        st.incr_label("sync_failed", _reason(e))
        if isinstance(e, PatchError) and e.reason == PatchReason.HASH_MISMATCH:
            st.incr("hash_mismatches")  # a signed version its patch does not produce

    def _fetch(self, m: PatchManifest) -> None:
        ref = m.blob
        st = self.env.status
        if self.env.store.has(ref.id):
            return

        def progress(done: int, total: int) -> None:
            st.transfer(ref.id, done, total)

        label = f"fetching v{m.version} {m.kind}"
        try:
            fetch_while_progressing(
                self.env.net, ref, self.env.settings.fetch_timeout_s, label, progress, self.env.stop
            )
        finally:
            st.transfer(ref.id, 1, 1)
        self.env.store.pin([ref.id])

    def _retain(self, version: int) -> None:
        """Forget manifests (and unpin blobs) well behind ``version``; keeps what peers may still ask for."""
        interval = self.env.g.patch.anchor_interval
        floor = version - max(2 * interval, 16)
        if floor > 0:
            self.env.store.unpin(self.book.prune_below(floor))


def _behind(base: Weights, version: int) -> bool:
    """Whether ``version`` is ahead of ``base``; an unverified base (e.g. a model whose weights come
    from the network) is behind its own version too, so it syncs from an anchor."""
    return version > base.version or (version == base.version and not base.verified)


def _reason(e: BaseException) -> str:
    name = type(e).__name__
    return name[:32]
