"""Local content-addressed blob store: sha256 ids, atomic writes, a size bound with retention.

Blobs live at ``<root>/<id[:2]>/<id>``; a write goes to a temp file, is fsynced, hash-checked and
renamed, so a crash never leaves a blob under an id it does not hash to. When the store would
exceed ``max_bytes`` the least recently used unpinned blobs are evicted; pinned blobs (the chain's
retained anchors and patches, a miner's current rollouts) are never evicted.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from p2prl.protocol import is_hex


class StoreError(Exception):
    """A blob that is missing, mis-hashed, or does not fit."""


def _check_id(blob_id: str) -> None:
    if not is_hex(blob_id, 32):
        raise StoreError(f"not a blob id: {blob_id!r}")


class BlobStore:
    def __init__(self, root: str | Path, max_bytes: int = 8 * 1024**3) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self._pinned: set[str] = set()
        self._sizes: dict[str, int] = {}
        for p in self.root.glob("??/*"):
            if is_hex(p.name, 32):
                self._sizes[p.name] = p.stat().st_size
            elif p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)

    def path(self, blob_id: str) -> Path:
        _check_id(blob_id)
        return self.root / blob_id[:2] / blob_id

    def has(self, blob_id: str) -> bool:
        with self._lock:
            return blob_id in self._sizes

    def size(self, blob_id: str) -> int:
        with self._lock:
            if blob_id not in self._sizes:
                raise StoreError(f"blob {blob_id[:16]} not held")
            return self._sizes[blob_id]

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._sizes)

    def put(self, data: bytes | memoryview, expected_id: str | None = None) -> str:
        """Store ``data``; returns its id. Raises StoreError if it does not hash to ``expected_id``."""
        blob_id = hashlib.sha256(data).hexdigest()
        if expected_id is not None and blob_id != expected_id:
            raise StoreError(f"data hashes to {blob_id[:16]}, expected {expected_id[:16]}")
        with self._lock:
            if blob_id in self._sizes:
                self._touch(blob_id)
                return blob_id
            self._make_room(len(data))
            dest = self.path(blob_id)
            dest.parent.mkdir(exist_ok=True)
            tmp = dest.with_name(f"{blob_id}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
            self._sizes[blob_id] = len(data)
        return blob_id

    def put_file(self, src: str | Path, expected_id: str | None = None) -> str:
        """Move a finished file into the store after checking its hash (for streamed downloads)."""
        h = hashlib.sha256()
        src = Path(src)
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        blob_id = h.hexdigest()
        if expected_id is not None and blob_id != expected_id:
            src.unlink(missing_ok=True)
            raise StoreError(f"file hashes to {blob_id[:16]}, expected {expected_id[:16]}")
        size = src.stat().st_size
        with self._lock:
            if blob_id in self._sizes:
                src.unlink(missing_ok=True)
                return blob_id
            self._make_room(size)
            dest = self.path(blob_id)
            dest.parent.mkdir(exist_ok=True)
            os.replace(src, dest)
            self._sizes[blob_id] = size
        return blob_id

    def get(self, blob_id: str) -> bytes:
        with self._lock:
            if blob_id not in self._sizes:
                raise StoreError(f"blob {blob_id[:16]} not held")
            self._touch(blob_id)
        return self.path(blob_id).read_bytes()

    def read_range(self, blob_id: str, offset: int, length: int) -> bytes:
        with self._lock:
            size = self._sizes.get(blob_id)
        if size is None:
            raise StoreError(f"blob {blob_id[:16]} not held")
        if offset < 0 or length < 0 or offset + length > size:
            raise StoreError(f"range {offset}+{length} outside blob of {size} bytes")
        with open(self.path(blob_id), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def delete(self, blob_id: str) -> None:
        with self._lock:
            if self._sizes.pop(blob_id, None) is not None:
                self.path(blob_id).unlink(missing_ok=True)
            self._pinned.discard(blob_id)

    def pin(self, blob_ids: Iterable[str]) -> None:
        with self._lock:
            self._pinned.update(blob_ids)

    def unpin(self, blob_ids: Iterable[str]) -> None:
        with self._lock:
            self._pinned.difference_update(blob_ids)

    def _touch(self, blob_id: str) -> None:
        # LRU order = dict order; re-insert to mark as recently used
        self._sizes[blob_id] = self._sizes.pop(blob_id)

    def _make_room(self, incoming: int) -> None:
        if incoming > self.max_bytes:
            raise StoreError(f"blob of {incoming} bytes exceeds the store bound of {self.max_bytes}")
        used = sum(self._sizes.values())
        for victim in list(self._sizes):
            if used + incoming <= self.max_bytes:
                return
            if victim in self._pinned:
                continue
            used -= self._sizes.pop(victim)
            self.path(victim).unlink(missing_ok=True)
        if used + incoming > self.max_bytes:
            raise StoreError("store full of pinned blobs")
