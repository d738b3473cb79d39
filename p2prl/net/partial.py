"""Partial downloads on disk: verified chunks survive an interruption and are served at once.

A partial blob is a sparse file ``<store root>/partial/<ref digest>.part`` of the blob's full size:
keyed by the digest of the whole ref, not the blob id, so a forged ref reusing an honest blob's id
neither finds nor truncates the honest download's file. A chunk
is written only after it hashed right, so on resume every chunk region is simply re-hashed: what
matches the signed chunk list is kept, the rest is fetched again (no separate bitmap to go stale).
The total size of partial files is bounded; the least recently touched are dropped first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

from p2prl.protocol import BlobRef, chunk_spans
from p2prl.store import BlobStore

log = logging.getLogger(__name__)


class PartialBlob:
    def __init__(self, ref: BlobRef, path: Path) -> None:
        self.ref = ref
        self.path = path
        self._lock = threading.Lock()
        self.have = [False] * ref.n_chunks
        self.closed = False
        if path.exists() and path.stat().st_size == ref.size:
            self._rescan()
        else:
            with open(path, "wb") as f:
                f.truncate(ref.size)
        self._fd = os.open(path, os.O_RDWR)

    def _rescan(self) -> None:
        with open(self.path, "rb") as f:
            for i, (off, n) in enumerate(chunk_spans(self.ref.size, self.ref.chunk_size)):
                f.seek(off)
                self.have[i] = hashlib.sha256(f.read(n)).hexdigest() == self.ref.chunks[i]
        if any(self.have):
            log.info("resuming %s with %d/%d chunks", self.ref.id[:16], self.count, self.ref.n_chunks)

    @property
    def count(self) -> int:
        return sum(self.have)

    @property
    def complete(self) -> bool:
        return all(self.have)

    def has(self, i: int) -> bool:
        return 0 <= i < len(self.have) and self.have[i]

    def write(self, i: int, data: bytes) -> bool:
        """Store chunk ``i`` if it hashes right; False (nothing written) if it does not."""
        if not self.ref.verify_chunk(i, data):
            return False
        with self._lock:
            if self.closed:
                return False
            if not self.have[i]:
                os.pwrite(self._fd, data, i * self.ref.chunk_size)
                self.have[i] = True
        return True

    def read(self, i: int) -> bytes | None:
        with self._lock:
            if self.closed or not self.has(i):
                return None
            return os.pread(self._fd, self.ref.chunk_len(i), i * self.ref.chunk_size)

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self._fd)


class PartialStore:
    """The partial downloads of one node, bounded in total bytes."""

    def __init__(self, store: BlobStore, max_bytes: int) -> None:
        self.store = store
        self.dir = store.root / "partial"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._open: dict[str, PartialBlob] = {}

    def get(self, digest: str) -> PartialBlob | None:
        with self._lock:
            return self._open.get(digest)

    def path(self, ref: BlobRef) -> Path:
        return self.dir / f"{ref.digest}.part"

    def open(self, ref: BlobRef) -> PartialBlob:
        """Open (creating or rescanning) the partial of ``ref``; blocking: keep it off the network thread."""
        with self._lock:
            p = self._open.get(ref.digest)
            if p is not None:
                return p
            if ref.size > self.max_bytes:
                raise ValueError(f"blob of {ref.size} bytes exceeds the partial-download bound")
            self._make_room(ref)
            p = PartialBlob(ref, self.path(ref))
            self._open[ref.digest] = p
            return p

    def _make_room(self, ref: BlobRef) -> None:
        # other downloads finish (their file moved into the store) or drop theirs while we list
        # the directory: a file gone by the time we stat it is simply not counted. (Statting in
        # the sort key once failed an unrelated download with ENOENT: an honest batch rejected.)
        files: list[tuple[float, int, Path]] = []
        for q in self.dir.glob("*.part"):
            try:
                st = q.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, q))
        files.sort(key=lambda f: f[0])
        used = sum(size for _, size, q in files if q.stem != ref.digest)
        for _, size, q in files:
            if used + ref.size <= self.max_bytes:
                break
            if q.stem == ref.digest or q.stem in self._open:
                continue
            used -= size
            q.unlink(missing_ok=True)
            log.info("dropped partial download %s to stay within bounds", q.stem[:16])

    def finish(self, ref: BlobRef) -> str:
        """Move a complete partial into the blob store (hash-checked there); returns the id.

        The partial stays listed as open until its file has moved, so ``_make_room`` (another
        download opening) never deletes a file that is being finished."""
        with self._lock:
            p = self._open.get(ref.digest)
        if p is not None:
            p.close()
        try:
            return self.store.put_file(self.path(ref), expected_id=ref.id)
        finally:
            with self._lock:
                if self._open.get(ref.digest) is p:
                    self._open.pop(ref.digest, None)

    def release(self, ref: BlobRef, keep: bool = True) -> None:
        """Stop tracking an unfinished download; its file stays for a later resume if ``keep``."""
        with self._lock:
            p = self._open.pop(ref.digest, None)
        if p is not None:
            p.close()
        if not keep:
            self.path(ref).unlink(missing_ok=True)
