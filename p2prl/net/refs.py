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
from collections import OrderedDict

from p2prl.net.store import BlobStore, StoreError
from p2prl.protocol.blobs import MAX_CHUNK_SIZE, MAX_CHUNKS, MIN_CHUNK_SIZE, BlobRef, chunk_spans

COMPUTES_PER_BLOB = 2  # chunk sizes a peer may make us hash one forgotten blob at


class RefBook:
    """Bounded map digest -> ref, plus the bounded on-demand computation for forgotten blobs."""

    def __init__(self, store: BlobStore, capacity: int = 8192) -> None:
        self.store = store
        self.capacity = capacity
        self._lock = threading.Lock()
        self._refs: OrderedDict[str, BlobRef] = OrderedDict()
        self._ids: OrderedDict[str, set[int]] = OrderedDict()  # blob id -> chunk sizes known or tried

    def add(self, ref: BlobRef) -> None:
        with self._lock:
            self._refs[ref.digest] = ref
            self._refs.move_to_end(ref.digest)
            self._note(ref.id, ref.chunk_size)
            while len(self._refs) > self.capacity:
                self._refs.popitem(last=False)

    def get(self, digest: str) -> BlobRef | None:
        with self._lock:
            return self._refs.get(digest)

    def _note(self, blob_id: str, chunk_size: int) -> None:
        self._ids.setdefault(blob_id, set()).add(chunk_size)
        self._ids.move_to_end(blob_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def may_compute(self, blob_id: str, chunk_size: int) -> bool:
        """A held blob with no ref known at this chunk size, and few sizes tried: worth one hash."""
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE or not self.store.has(blob_id):
            return False
        with self._lock:
            return self._may(blob_id, chunk_size)

    def compute(self, blob_id: str, chunk_size: int) -> BlobRef | None:
        """Hash our own copy of ``blob_id`` at ``chunk_size`` and register that ref (blocking)."""
        with self._lock:
            if not self._may(blob_id, chunk_size):
                return None
            self._note(blob_id, chunk_size)
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

    def _may(self, blob_id: str, chunk_size: int) -> bool:
        tried = self._ids.get(blob_id, set())
        return chunk_size not in tried and len(tried) < COMPUTES_PER_BLOB
