"""The refs a node answers chunk requests for, by digest (docs/SECURITY.md, item 2).

A request names the digest of the requester's ref. A node answers only under a ref it knows:
one it published or fetched (registered here), or, for a blob it holds whose ref it has
forgotten (after a restart), the ref it computes from its own bytes at the requested chunk size.
So an honest node never sends bytes that fail the requester's check, and a forged ref that
reuses an honest blob's id gets NOT_FOUND instead of genuine bytes that look bad.
"""

from __future__ import annotations

import hashlib
import threading

from p2prl.lru import LRU
from p2prl.protocol import MAX_CHUNK_SIZE, MAX_CHUNKS, MIN_CHUNK_SIZE, BlobRef, chunk_spans
from p2prl.store import BlobStore, StoreError

COMPUTES_PER_BLOB = 4  # times a peer may make us hash one held blob whose ref we do not know


class RefBook:
    """Bounded map digest -> ref, plus the bounded on-demand computation for forgotten blobs.

    Only refs of blobs we hold or fetched enter it (never a peer's unverified ref), and at most
    ``capacity`` of them, least recently added dropped first."""

    def __init__(self, store: BlobStore, capacity: int = 1024) -> None:
        self.store = store
        self.capacity = capacity
        self._lock = threading.Lock()
        self._refs: LRU[str, BlobRef] = LRU(capacity, on_evict=self._forget)
        self._sizes: dict[str, set[int]] = {}  # blob id -> chunk sizes of the refs held now
        self._computed: LRU[str, int] = LRU(4 * capacity)  # blob id -> computations so far

    def add(self, ref: BlobRef) -> None:
        with self._lock:
            self._refs.put(ref.digest, ref)
            self._sizes.setdefault(ref.id, set()).add(ref.chunk_size)

    def _forget(self, _digest: str, old: BlobRef) -> None:
        sizes = self._sizes.get(old.id, set())
        sizes.discard(old.chunk_size)
        if not sizes:
            self._sizes.pop(old.id, None)

    def get(self, digest: str) -> BlobRef | None:
        with self._lock:
            return self._refs.get(digest)

    def may_compute(self, blob_id: str, chunk_size: int) -> bool:
        """A held blob with no ref known at this chunk size, not hashed too often: worth one hash."""
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE or not self.store.has(blob_id):
            return False
        with self._lock:
            return self._may(blob_id, chunk_size)

    def _may(self, blob_id: str, chunk_size: int) -> bool:
        known = chunk_size in self._sizes.get(blob_id, ())
        return not known and self._computed.get(blob_id, 0) < COMPUTES_PER_BLOB

    def compute(self, blob_id: str, chunk_size: int) -> BlobRef | None:
        """Hash our own copy of ``blob_id`` at ``chunk_size`` and register that ref (blocking)."""
        with self._lock:
            if not self._may(blob_id, chunk_size):
                return None
            self._computed.put(blob_id, self._computed.get(blob_id, 0) + 1)
        try:
            size = self.store.size(blob_id)
            n = max(1, -(-size // chunk_size))
            if n > MAX_CHUNKS:
                return None
            chunks = []
            with open(self.store.path(blob_id), "rb") as f:
                for off, length in chunk_spans(size, chunk_size):
                    f.seek(off)
                    chunks.append(hashlib.sha256(f.read(length)).hexdigest())
        except (StoreError, OSError):
            return None
        ref = BlobRef(blob_id, size, chunk_size, tuple(chunks))
        self.add(ref)
        return ref
