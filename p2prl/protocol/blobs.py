"""Content-addressed blobs: sha256 id, fixed-size chunks, per-chunk sha256 listed in signed manifests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from p2prl.crypto import canonical_bytes
from p2prl.protocol.fields import bad_body, check_hex, hex_field, int_field, list_field

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
MIN_CHUNK_SIZE = 16 * 1024
MAX_CHUNK_SIZE = 16 * 1024 * 1024
MAX_CHUNKS = 2048
MAX_BLOB_BYTES = 16 * 1024**3


@dataclass(frozen=True)
class BlobRef:
    """What a receiver needs to fetch and verify a blob chunk by chunk."""

    id: str  # sha256 of the whole blob, hex
    size: int
    chunk_size: int
    chunks: tuple[str, ...]  # sha256 of each chunk, hex

    def to_body(self) -> dict[str, Any]:
        return {"id": self.id, "size": self.size, "chunk_size": self.chunk_size, "chunks": list(self.chunks)}

    @classmethod
    def from_body(cls, body: Any) -> BlobRef:
        if not isinstance(body, dict):
            raise bad_body("blob must be an object")
        ref = cls(
            id=hex_field(body, "id", 32),
            size=int_field(body, "size", 0, MAX_BLOB_BYTES),
            chunk_size=int_field(body, "chunk_size", MIN_CHUNK_SIZE, MAX_CHUNK_SIZE),
            chunks=tuple(list_field(body, "chunks", MAX_CHUNKS)),
        )
        for c in ref.chunks:
            check_hex(c, 32, "chunk hash")
        expected = max(1, -(-ref.size // ref.chunk_size))
        if len(ref.chunks) != expected:
            raise bad_body(f"blob of {ref.size} bytes needs {expected} chunks, lists {len(ref.chunks)}")
        return ref

    @cached_property
    def digest(self) -> str:
        """sha256 of the canonical ref: names this exact chunk list, not just the blob's bytes.

        Chunk requests and partial downloads are keyed by it, so a forged ref that reuses an honest
        blob's id never makes the honest holder's bytes look bad (docs/SECURITY.md, item 2).
        """
        return hashlib.sha256(canonical_bytes(self.to_body())).hexdigest()

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def chunk_len(self, i: int) -> int:
        if not 0 <= i < self.n_chunks:
            raise IndexError(i)
        return min(self.chunk_size, self.size - i * self.chunk_size) if self.size else 0

    def verify_chunk(self, i: int, data: bytes) -> bool:
        return len(data) == self.chunk_len(i) and hashlib.sha256(data).hexdigest() == self.chunks[i]


def chunk_spans(size: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each chunk; an empty blob has one empty chunk."""
    if size == 0:
        yield (0, 0)
        return
    for off in range(0, size, chunk_size):
        yield (off, min(chunk_size, size - off))


def blob_ref_for(data: bytes | memoryview, chunk_size: int = DEFAULT_CHUNK_SIZE) -> BlobRef:
    """Compute the ref (id and chunk hashes) of an in-memory blob."""
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size {chunk_size} out of range")
    mv = memoryview(data)
    n = -(-len(mv) // chunk_size) if len(mv) else 1
    if n > MAX_CHUNKS:
        chunk_size = -(-len(mv) // MAX_CHUNKS)
        chunk_size = min(MAX_CHUNK_SIZE, max(chunk_size, MIN_CHUNK_SIZE))
    chunks = tuple(hashlib.sha256(mv[o : o + n]).hexdigest() for o, n in chunk_spans(len(mv), chunk_size))
    return BlobRef(id=hashlib.sha256(mv).hexdigest(), size=len(mv), chunk_size=chunk_size, chunks=chunks)
