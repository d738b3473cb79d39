"""The trainer-signed manifests a node knows, by version: from gossip, from S3, and from its own disk.

Every envelope is verified against the pinned trainer key before it is kept (also those read back
from disk), the number kept is bounded, and a conflicting manifest for a version already held (a
forked or replayed trainer message) is refused and counted, so the chain a node syncs along is one.
An anchor version has two manifests (its delta and its anchor), so entries are keyed by
(version, kind).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from p2prl.atomicfile import write_atomic
from p2prl.crypto.envelope import EnvelopeError
from p2prl.protocol.messages import MessageError, PatchManifest, decode_message

log = logging.getLogger(__name__)


class ManifestBook:
    def __init__(
        self, network_id: str, trainer_key: bytes, directory: Path | None, capacity: int = 512
    ) -> None:
        self.network_id = network_id
        self.trainer_key = trainer_key
        self.directory = Path(directory) if directory is not None else None
        self.capacity = capacity
        self._lock = threading.Lock()
        self._by_key: dict[tuple[int, str], tuple[PatchManifest, bytes]] = {}
        self.changed = threading.Event()
        self.conflicts = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            for p in sorted(self.directory.glob("*.env")):
                try:
                    self.add(p.read_bytes(), persist=False)
                except (OSError, ValueError) as e:
                    log.warning("dropping unreadable manifest %s: %s", p, e)
                    p.unlink(missing_ok=True)

    def verify(self, envelope: bytes) -> PatchManifest:
        """Parse an envelope that must be a manifest signed by the trainer (raises ValueError)."""
        try:
            _, msg = decode_message(
                envelope,
                self.network_id,
                expected_type=PatchManifest.TYPE,
                allowed_signers=frozenset({self.trainer_key}),
            )
        except (EnvelopeError, MessageError) as e:
            raise ValueError(f"manifest rejected: {e}") from e
        assert isinstance(msg, PatchManifest)
        return msg

    def add(self, envelope: bytes, *, persist: bool = True) -> PatchManifest | None:
        """Keep a verified manifest; returns it if new, None if already held (raises if invalid)."""
        m = self.verify(envelope)
        key = (m.version, m.kind)
        with self._lock:
            held = self._by_key.get(key)
            other = self._by_key.get((m.version, "anchor" if m.kind == "delta" else "delta"))
            if other is not None and other[0].result_hash != m.result_hash:
                self.conflicts += 1
                raise ValueError(f"conflicting manifests for version {m.version}")
            if held is not None:
                if held[0].result_hash != m.result_hash or held[0].blob.id != m.blob.id:
                    self.conflicts += 1
                    raise ValueError(f"conflicting manifest for version {m.version}")
                return None
            self._by_key[key] = (m, envelope)
            while len(self._by_key) > self.capacity:
                oldest = min(self._by_key)
                del self._by_key[oldest]
                if self.directory is not None:
                    (self.directory / _name(oldest)).unlink(missing_ok=True)
        if persist and self.directory is not None:
            p = self.directory / _name(key)
            write_atomic(p, envelope)
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
        with self._lock:
            return [m for _, (m, _) in sorted(self._by_key.items())]

    def versions(self) -> list[int]:
        with self._lock:
            return sorted({v for v, _ in self._by_key})

    def prune_below(self, version: int) -> list[str]:
        """Forget manifests older than ``version`` except the anchor the retained ones start from;
        returns the blob ids of those forgotten (so the caller can unpin them)."""
        with self._lock:
            anchors = [v for v, k in self._by_key if k == "anchor" and v <= version]
            floor = max(anchors, default=0)
            gone = [k for k in self._by_key if k[0] < version and not (k[0] == floor and k[1] == "anchor")]
            ids = [self._by_key[k][0].blob.id for k in gone]
            for k in gone:
                del self._by_key[k]
                if self.directory is not None:
                    (self.directory / _name(k)).unlink(missing_ok=True)
        return ids


def _name(key: tuple[int, str]) -> str:
    return f"{key[0]:012d}-{key[1]}.env"
