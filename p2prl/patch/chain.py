"""The checkpoint chain (DESIGN §3, docs/PROTOCOL.md §5): signed manifests, anchors, deltas.

Version 0 is an anchor. Every later version ``v`` has a delta manifest (``v-1 -> v``); every
``anchor_interval``-th version also has an anchor manifest (a full safetensors checkpoint). A node
at version ``h`` with the right hash takes the fast path (the deltas ``h+1..t``); anyone else
takes the slow path (the newest anchor at or below ``t`` and the deltas after it). Retention
never drops an anchor that a retained delta's slow path needs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from p2prl.atomicfile import write_atomic
from p2prl.crypto import Identity
from p2prl.gilslices import short_gil_slices
from p2prl.patch.anchors import ANCHOR_CODEC, decode_anchor, encode_anchor
from p2prl.patch.apply import PatchApplier
from p2prl.patch.dtypes import uint_view
from p2prl.patch.encode import PatchEncoder
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import CODEC
from p2prl.patch.hashing import weights_hash
from p2prl.patch.manifests import ManifestStore
from p2prl.patch.scatter import scatter_all
from p2prl.protocol import DEFAULT_CHUNK_SIZE, PatchManifest, blob_ref_for, encode_message
from p2prl.store import BlobStore, StoreError

STATE_FILE = "chain.json"
COPY_DIV = 32  # a segment with more than 1/COPY_DIV of its elements changed is copied whole


@dataclass(frozen=True)
class Published:
    """One signed manifest, its envelope bytes, and the blob it names."""

    manifest: PatchManifest
    envelope: bytes
    blob: bytes


@dataclass(frozen=True)
class PublishedVersion:
    """What one publish produced: a delta (absent at version 0), an anchor (at anchor versions)."""

    version: int
    result_hash: str
    delta: Published | None
    anchor: Published | None

    @property
    def items(self) -> list[Published]:
        return [p for p in (self.delta, self.anchor) if p is not None]

    @property
    def primary(self) -> Published:
        """The fast-path object: the delta, or the anchor at version 0."""
        p = self.delta or self.anchor
        assert p is not None
        return p

    @property
    def manifest(self) -> PatchManifest:
        return self.primary.manifest

    @property
    def envelope(self) -> bytes:
        return self.primary.envelope

    @property
    def blob(self) -> bytes:
        return self.primary.blob


# -- indexing and planning ---------------------------------------------------------------------


class _Links:
    """A planning view of verified manifests: at most one delta and one anchor per version."""

    def __init__(self, manifests: Iterable[PatchManifest]) -> None:
        self.deltas: dict[int, PatchManifest] = {}
        self.anchors: dict[int, PatchManifest] = {}
        for m in manifests:
            table = self.deltas if m.kind == "delta" else self.anchors
            old = table.get(m.version)
            if old is not None and old.result_hash != m.result_hash:
                raise PatchError(
                    PatchReason.BAD_MANIFEST,
                    f"two {m.kind} manifests for version {m.version} disagree",
                )
            table[m.version] = m

    @property
    def newest(self) -> int | None:
        vs = list(self.deltas) + list(self.anchors)
        return max(vs) if vs else None

    def all(self) -> list[PatchManifest]:
        return sorted([*self.deltas.values(), *self.anchors.values()], key=lambda m: (m.version, m.kind))

    def hash_at(self, version: int) -> str | None:
        m = self.deltas.get(version) or self.anchors.get(version)
        return m.result_hash if m else None

    def deltas_between(self, start: int, start_hash: str, target: int) -> list[PatchManifest] | None:
        """Hash-linked deltas start+1..target, or None if one is missing or does not link."""
        out, h = [], start_hash
        for v in range(start + 1, target + 1):
            d = self.deltas.get(v)
            if d is None or d.base_hash != h:
                return None
            out.append(d)
            h = d.result_hash
        return out


Manifests = ManifestStore | Iterable[PatchManifest] | Mapping[int, PatchManifest | Sequence[PatchManifest]]


def _links(manifests: Manifests) -> _Links:
    """A consistent snapshot to plan on (a store may gain manifests meanwhile)."""
    if isinstance(manifests, ManifestStore):
        return _Links(manifests.all())
    items: list[PatchManifest] = []
    values = manifests.values() if isinstance(manifests, Mapping) else manifests
    for v in values:
        if isinstance(v, PatchManifest):
            items.append(v)
        else:
            items.extend(v)
    return _Links(items)


def _cost(plan: Sequence[PatchManifest]) -> int:
    return sum(m.blob.size for m in plan)


def plan_sync(
    have_version: int | None,
    have_hash: str | None,
    manifests: Manifests,
    target: int,
) -> list[PatchManifest]:
    """The manifests to apply, in order, to reach ``target``; [] when already there.

    Fast path: the hash-linked deltas after ``have_version`` when ``have_hash`` is the chain's
    hash there. Slow path: the newest anchor at or below ``target`` plus the deltas after it;
    taken on a gap, a hash mismatch, no current state, or when it moves fewer bytes.
    """
    index = _links(manifests)
    if target < 0:
        raise PatchError(PatchReason.BAD_INPUT, "target version must be non-negative")
    if have_version == target and have_hash is not None and index.hash_at(target) in (None, have_hash):
        return []
    fast = None
    if have_version is not None and have_hash is not None and have_version < target:
        fast = index.deltas_between(have_version, have_hash, target)
    slow = None
    for a in sorted((v for v in index.anchors if v <= target), reverse=True):
        rest = index.deltas_between(a, index.anchors[a].result_hash, target)
        if rest is not None:
            slow = [index.anchors[a], *rest]
            break
    if fast is not None and (slow is None or _cost(fast) <= _cost(slow)):
        return fast
    if slow is not None:
        return slow
    raise PatchError(
        PatchReason.UNAVAILABLE,
        f"no verified path to version {target}: missing anchor or delta",
    )


def checked_blob(m: PatchManifest, load_blob: Callable[[str], bytes]) -> bytes:
    """The blob ``m`` names, of the size it declares, in a codec this node reads; PatchError otherwise."""
    try:
        blob = load_blob(m.blob.id)
    except (StoreError, KeyError, OSError) as e:
        raise PatchError(
            PatchReason.UNAVAILABLE, f"blob {m.blob.id[:16]} of version {m.version} unavailable: {e}"
        ) from None
    if len(blob) != m.blob.size:
        raise PatchError(
            PatchReason.HASH_MISMATCH,
            f"blob of version {m.version} has {len(blob)} bytes, manifest says {m.blob.size}",
        )
    codec = ANCHOR_CODEC if m.kind == "anchor" else CODEC
    if m.codec != codec:
        raise PatchError(PatchReason.UNSUPPORTED, f"unsupported {m.kind} codec {m.codec!r}")
    return blob


def materialize(
    start_state: Mapping[str, torch.Tensor] | None,
    plan: Sequence[PatchManifest],
    load_blob: Callable[[str], bytes],
    *,
    start_hash: str | None = None,
) -> dict[str, torch.Tensor]:
    """Apply ``plan`` (from plan_sync) to ``start_state``, checking every hash on the way.

    Each delta must apply to the hash its manifest names and produce the hash its manifest
    promises; each anchor must hash to its manifest's result hash. ``start_hash`` is the
    caller's own verified hash of ``start_state`` (computed if None and needed). ``start_state``
    is never modified; any failure raises PatchError and returns nothing.
    """
    state: Mapping[str, torch.Tensor] | None = start_state
    h = start_hash
    for m in plan:
        blob = checked_blob(m, load_blob)
        if m.kind == "anchor":
            state = decode_anchor(blob, m.result_hash)
            h = m.result_hash
            continue
        if state is None:
            raise PatchError(
                PatchReason.WRONG_BASE,
                f"version {m.version} is a delta but there is no state to apply it to",
            )
        if h is not None and h != m.base_hash:
            raise PatchError(
                PatchReason.WRONG_BASE,
                f"version {m.version} applies to {m.base_hash[:16]}…, state is {h[:16]}…",
            )
        applier = PatchApplier(state, base_hash=h)
        applier.feed(blob)
        if applier.header is not None and applier.header.base_hash != m.base_hash:
            raise PatchError(
                PatchReason.WRONG_BASE,
                f"patch of version {m.version} does not match its manifest's base hash",
            )
        new_state = applier.finish()
        if applier.result_hash != m.result_hash:
            raise PatchError(
                PatchReason.HASH_MISMATCH,
                f"patch of version {m.version} does not produce its manifest's result hash",
            )
        state, h = new_state, m.result_hash
    if state is None:
        raise PatchError(PatchReason.BAD_INPUT, "empty plan and no start state")
    return dict(state)


# -- retention ---------------------------------------------------------------------------------


def retention(manifests: Manifests, keep_versions: int) -> tuple[set[str], set[str]]:
    """(blob ids to keep, blob ids that may be deleted) when serving the newest ``keep_versions``.

    Kept: every delta and anchor from the newest anchor at or below the oldest retained version
    onward, so each retained version is reachable by both paths. Everything older may go.
    """
    if keep_versions < 1:
        raise ValueError("keep_versions must be at least 1")
    index = _links(manifests)
    newest = index.newest
    if newest is None:
        return set(), set()
    oldest = max(0, newest - keep_versions + 1)
    floor_anchor = max((v for v in index.anchors if v <= oldest), default=None)
    if floor_anchor is None:  # no anchor below: keep from the oldest anchor we have
        floor_anchor = min(index.anchors, default=0)
    keep, drop = set(), set()
    for m in index.all():
        needed = m.version >= floor_anchor and not (m.kind == "delta" and m.version == floor_anchor)
        (keep if needed or m.version >= oldest else drop).add(m.blob.id)
    return keep, drop - keep


# -- publishing --------------------------------------------------------------------------------


def _write_changes(
    copy: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], enc: PatchEncoder
) -> None:
    """Bring ``copy`` (the encoder's base) up to ``new``: only the elements the patch changes."""
    names = [s.name for s in enc.specs]
    scatters = []
    for ti, start, pos, nv in enc.changes:
        dst, src = uint_view(copy[names[ti]])[start:], uint_view(new[names[ti]])[start:]
        n = min(enc.segment_span, dst.size)
        if pos is None or nv is None or pos.size * COPY_DIV > n:  # many changes: a straight copy beats a scatter
            dst[:n] = src[:n]
        else:
            scatters.append((dst, pos, nv))  # the new bits the encoder gathered: nothing read from ``new``
    scatter_all(scatters)


class ChainPublisher:
    """The trainer's side: signs and stores one version per ``publish``.

    Persists under ``root``: ``chain.json`` (the commit point: network, trainer, newest version
    and hash), ``manifests/`` (the signed envelopes, a :class:`ManifestStore`) and the blobs, in
    ``store`` (default ``root/blobs``), pinned while retained. A restarted publisher rebuilds its
    last state from its newest anchor and deltas and continues at the next version, never
    reusing one; manifests signed after the last commit point are discarded and signed again.
    """

    def __init__(
        self,
        root: str | Path,
        identity: Identity,
        network: str,
        *,
        anchor_interval: int = 10,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        zstd_level: int = 1,
        keep_versions: int = 20,
        store: BlobStore | None = None,
    ) -> None:
        if anchor_interval < 1 or keep_versions < 1:
            raise ValueError("anchor_interval and keep_versions must be at least 1")
        self.root = Path(root)
        self.identity = identity
        self.network = network
        self.anchor_interval = anchor_interval
        self.chunk_size = chunk_size
        self.zstd_level = zstd_level
        self.keep_versions = keep_versions
        self.store = store or BlobStore(self.root / "blobs", max_bytes=1 << 62)
        self.version: int | None = None
        self.result_hash: str | None = None
        self._state: dict[str, torch.Tensor] | None = None
        self.last_encode_s = 0.0  # the newest publish's diff and encode (for the node's status)
        self._broken: BaseException | None = None  # a failed publish whose state could not be rebuilt
        self.manifests = self._resume()

    # persistence

    def _open_manifests(self) -> ManifestStore:
        """The publisher's manifests (only after its state file named this network and key: the
        store drops, from disk too, every envelope that does not verify against them)."""
        # retention keeps at most keep_versions + anchor_interval versions, two manifests at anchors
        capacity = 2 * (self.keep_versions + self.anchor_interval) + 4
        return ManifestStore(self.network, self.identity.public_key, self.root / "manifests", capacity)

    def _resume(self) -> ManifestStore:
        path = self.root / STATE_FILE
        if not path.exists():
            manifests = self._open_manifests()
            manifests.discard_after(-1)  # signed before the first commit: signed again
            return manifests
        try:
            meta = json.loads(path.read_text())
            version, result_hash = int(meta["version"]), str(meta["result_hash"])
            network, trainer = meta["network"], meta["trainer"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PatchError(PatchReason.UNAVAILABLE, f"{path} is unreadable: {e}") from None
        if network != self.network or trainer != self.identity.public_hex:
            raise PatchError(PatchReason.BAD_INPUT, f"{path} belongs to another network or trainer key")
        manifests = self._open_manifests()
        manifests.discard_after(version)
        plan = plan_sync(None, None, manifests, version)
        if not plan or plan[-1].result_hash != result_hash:
            raise PatchError(PatchReason.UNAVAILABLE, f"cannot rebuild version {version} from {self.root}")
        self._state = materialize(None, plan, self.store.get)
        self.version, self.result_hash = version, result_hash
        self.store.pin(m.blob.id for m in manifests.all())
        return manifests

    def _commit(self) -> None:
        meta = {
            "network": self.network,
            "trainer": self.identity.public_hex,
            "version": self.version,
            "result_hash": self.result_hash,
        }
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.root / STATE_FILE, json.dumps(meta, sort_keys=True).encode())

    # publishing

    def _sign(self, m: PatchManifest, blob: bytes) -> Published:
        env = encode_message(self.identity, self.network, m)
        self.store.put(blob, expected_id=m.blob.id)
        self.store.pin([m.blob.id])
        self.manifests.add(env)
        return Published(manifest=m, envelope=env, blob=blob)

    def publish(self, state: Mapping[str, torch.Tensor]) -> PublishedVersion:
        """Publish ``state`` (the trainer's bf16 weights) as the next version.

        ``state`` is read in place (it must not change until this returns); the chain's own copy of
        the last version is brought up to it by writing the elements the patch changes, beside the
        signing and storing (a failure there rebuilds the copy from the last commit), so a publish
        costs one read of both states and a pass over the changed elements, not a copy of the model.
        It runs in short GIL slices: beside the learner's thread, each of its thousands of short
        calls would otherwise wait for a 5 ms slice (p2prl/gilslices.py)."""
        with short_gil_slices():
            return self._publish(state)

    def _publish(self, state: Mapping[str, torch.Tensor]) -> PublishedVersion:
        if self._broken is not None:
            raise PatchError(PatchReason.UNAVAILABLE, f"the chain could not be rebuilt: {self._broken}")
        delta = anchor = None
        t0 = time.monotonic()
        if self._state is None:
            v = 0
            snapshot = {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in state.items()}
            blob = encode_anchor(snapshot)
            result_hash = weights_hash(snapshot)
        else:
            v = (self.version or 0) + 1
            new = {k: t.detach().contiguous() for k, t in state.items()}
            snapshot = self._state
            enc = PatchEncoder(snapshot, new, zstd_level=self.zstd_level, base_hash=self.result_hash)
            dblob = b"".join(enc.segments())
            assert enc.result_hash is not None and self.result_hash is not None
            result_hash = enc.result_hash
            self.last_encode_s = time.monotonic() - t0
            # the copy of the last version moves on to this one beside the signing and storing (it
            # reads ``new`` and the encoder's changes, which those do not touch)
            failed: list[BaseException] = []

            def write() -> None:
                try:
                    _write_changes(snapshot, new, enc)
                except BaseException as e:  # raised on the publishing thread below
                    failed.append(e)

            writer = threading.Thread(target=write, name="chain-copy")
            writer.start()
            try:
                m = PatchManifest(
                    version=v,
                    base_version=v - 1,
                    base_hash=self.result_hash,
                    result_hash=result_hash,
                    kind="delta",
                    codec=CODEC,
                    blob=blob_ref_for(dblob, self.chunk_size),
                    anchor_version=v - v % self.anchor_interval,
                )
                delta = self._sign(m, dblob)
                blob = encode_anchor(new) if v % self.anchor_interval == 0 else None
                if blob is not None:
                    anchor = self._sign(self._anchor_manifest(v, result_hash, blob), blob)
            except BaseException:
                writer.join()
                self._rebuild()  # the copy moved on to a version that was not committed
                raise
            writer.join()
            if failed:  # signed and stored, but the copy is not this version: start again from disk
                self._rebuild()
                raise failed[0]
        if anchor is None and blob is not None:  # version 0
            anchor = self._sign(self._anchor_manifest(v, result_hash, blob), blob)
        self.version, self.result_hash, self._state = v, result_hash, snapshot
        self._commit()
        return PublishedVersion(version=v, result_hash=result_hash, delta=delta, anchor=anchor)

    def _anchor_manifest(self, v: int, result_hash: str, blob: bytes) -> PatchManifest:
        return PatchManifest(
            version=v,
            base_version=v,
            base_hash="",
            result_hash=result_hash,
            kind="anchor",
            codec=ANCHOR_CODEC,
            blob=blob_ref_for(blob, self.chunk_size),
            anchor_version=v,
        )

    def _rebuild(self) -> None:
        """The chain's copy and books as of the last commit (after a publish failed half-way); if
        that cannot be read back either, the publisher refuses to publish again."""
        try:
            self.manifests = self._resume()
        except BaseException as e:
            self._broken = e
            raise

    def prune(self) -> set[str]:
        """Apply retention to the publisher's own store and manifests; returns deleted blob ids."""
        keep, drop = retention(self.manifests, self.keep_versions)
        self.manifests.discard([(m.version, m.kind) for m in self.manifests.all() if m.blob.id in drop])
        self.store.unpin(drop)
        for blob_id in drop:
            self.store.delete(blob_id)
        self.store.pin(keep)
        return drop

    @property
    def state(self) -> dict[str, torch.Tensor] | None:
        """The last published weights (do not modify)."""
        return self._state
