"""The one store of trainer-signed manifests, by (version, kind): the trainer's own and every peer's.

Every envelope is verified against the pinned trainer key before it is kept (also those read back
from disk), the number kept is bounded (the oldest go first), and a manifest that conflicts with
one held for its version (another result or blob for the same (version, kind), or a delta and an
anchor of one version that disagree: a forked or replayed trainer message) is refused and counted,
so the chain a node follows or publishes is one. An anchor version has two manifests (its delta
and its anchor), so entries are keyed by (version, kind).

On disk (``directory``, optional) each envelope is one file, named by :func:`manifest_file_name`
(``<version, 12 digits>-<kind>.env``), the layout every node has written since its first version.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from p2prl.atomicfile import write_atomic
from p2prl.crypto import EnvelopeError
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.protocol import MessageError, PatchManifest, decode_message

log = logging.getLogger(__name__)

CAPACITY = 512  # manifests held: 256 versions with an anchor each, far above any retention window

Key = tuple[int, str]  # (version, kind)


class ManifestError(PatchError):
    """A manifest that cannot be kept: not signed by the trainer for this network, or conflicting
    with one held for its version."""


def manifest_file_name(version: int, kind: str) -> str:
    """The file a manifest envelope is kept in (sorts by version)."""
    return f"{version:012d}-{kind}.env"


def open_manifest(data: bytes, network: str, trainer: bytes) -> PatchManifest:
    """Verify a manifest envelope signed by the pinned trainer key; ManifestError otherwise."""
    try:
        _, msg = decode_message(
            data, network, expected_type=PatchManifest.TYPE, allowed_signers=frozenset({trainer})
        )
    except (EnvelopeError, MessageError) as e:
        raise ManifestError(PatchReason.BAD_MANIFEST, f"manifest rejected: {e}") from None
    assert isinstance(msg, PatchManifest)
    return msg


class ManifestStore:
    """Verified manifests and their envelopes; thread-safe; ``changed`` is set on every addition."""

    def __init__(
        self, network_id: str, trainer_key: bytes, directory: Path | None = None, capacity: int = CAPACITY
    ) -> None:
        if capacity < 2:
            raise ValueError("capacity must hold at least one version's delta and anchor")
        self.network_id = network_id
        self.trainer_key = trainer_key
        self.directory = Path(directory) if directory is not None else None
        self.capacity = capacity
        self._lock = threading.Lock()
        self._by_key: dict[Key, tuple[PatchManifest, bytes]] = {}
        self.changed = threading.Event()
        self.conflicts = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            for p in sorted(self.directory.glob("*.env")):
                try:
                    self.add(p.read_bytes(), persist=False)
                except (OSError, ManifestError) as e:
                    log.warning("dropping unreadable manifest %s: %s", p, e)
                    p.unlink(missing_ok=True)

    def verify(self, envelope: bytes) -> PatchManifest:
        """Parse an envelope that must be a manifest signed by the trainer (raises ManifestError)."""
        return open_manifest(envelope, self.network_id, self.trainer_key)

    def add(self, envelope: bytes, *, persist: bool = True) -> PatchManifest | None:
        """Keep a verified manifest; returns it if new, None if already held (raises ManifestError)."""
        m = self.verify(envelope)
        key = (m.version, m.kind)
        with self._lock:
            held = self._by_key.get(key)
            other = self._by_key.get((m.version, "anchor" if m.kind == "delta" else "delta"))
            if other is not None and other[0].result_hash != m.result_hash:
                self.conflicts += 1
                raise ManifestError(PatchReason.BAD_MANIFEST, f"conflicting manifests for version {m.version}")
            if held is not None:
                if held[0].result_hash != m.result_hash or held[0].blob.id != m.blob.id:
                    self.conflicts += 1
                    raise ManifestError(PatchReason.BAD_MANIFEST, f"conflicting manifest for version {m.version}")
                return None
            self._by_key[key] = (m, envelope)
            while len(self._by_key) > self.capacity:
                self._forget(min(self._by_key))
        if persist and self.directory is not None:
            write_atomic(self.directory / manifest_file_name(*key), envelope)
        self.changed.set()
        return m

    def get(self, version: int, kind: str = "delta") -> PatchManifest | None:
        with self._lock:
            held = self._by_key.get((version, kind))
        return held[0] if held else None

    def newest(self) -> PatchManifest | None:
        with self._lock:
            if not self._by_key:
                return None
            return self._by_key[max(self._by_key)][0]

    def all(self) -> list[PatchManifest]:
        """Every manifest held, by (version, kind)."""
        with self._lock:
            return [m for _, (m, _) in sorted(self._by_key.items())]

    def envelopes(self, since: int = 0) -> list[bytes]:
        """The signed envelopes of versions ``since`` and later, by (version, kind)."""
        with self._lock:
            return [e for (v, _), (_, e) in sorted(self._by_key.items()) if v >= since]

    def versions(self) -> list[int]:
        with self._lock:
            return sorted({v for v, _ in self._by_key})

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    def discard(self, keys: Iterable[Key]) -> list[str]:
        """Forget these (version, kind) entries and their files; returns the blob ids they named."""
        with self._lock:
            return [blob_id for k in keys if (blob_id := self._forget(k)) is not None]

    def discard_after(self, version: int) -> list[str]:
        """Forget every manifest newer than ``version`` (signed but never committed: a publisher
        that crashed before its commit point republishes that version)."""
        with self._lock:
            gone = [k for k in self._by_key if k[0] > version]
        return self.discard(gone)

    def prune_below(self, version: int) -> list[str]:
        """Forget manifests older than ``version`` except the anchor the retained ones start from;
        returns the blob ids of those forgotten (so the caller can unpin them)."""
        with self._lock:
            anchors = [v for v, k in self._by_key if k == "anchor" and v <= version]
            floor = max(anchors, default=0)
            gone = [k for k in self._by_key if k[0] < version and not (k[0] == floor and k[1] == "anchor")]
        return self.discard(gone)

    def _forget(self, key: Key) -> str | None:
        held = self._by_key.pop(key, None)
        if self.directory is not None:
            (self.directory / manifest_file_name(*key)).unlink(missing_ok=True)
        return held[0].blob.id if held is not None else None
