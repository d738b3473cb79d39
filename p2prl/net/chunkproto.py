"""Wire format of the chunk protocol (``/p2prl/chunk/2.0.0``) and bounded, timed stream I/O.

One stream carries a sequence of request/response pairs (opening a stream per chunk costs a
multistream negotiation each time). All integers are big-endian::

    request   op u8 | blob id 32 (raw sha256) | ref digest 32 | index u32 | chunk size u32   (73 bytes)
    response  status u8 | length u32 | payload (length bytes)

    op      1 = HAVE (index ignored), 2 = GET chunk ``index``; the chunk size comes from the
            requester's signed BlobRef, so any node can serve a stored blob without its manifest
    digest  sha256 of the canonical BlobRef the requester verifies against (``BlobRef.digest``): a
            node answers only for a ref it holds under that digest (NOT_FOUND otherwise), so the
            bytes it sends match the chunk hashes the requester checks, and a mismatch is the
            provider's own lie, never a forged ref's doing
    status  0 = OK, 1 = NOT_FOUND, 2 = BUSY (ask again later or elsewhere), 3 = BAD_REQUEST
    payload GET/OK: the chunk bytes; HAVE/OK: n_chunks u32 | bitmap ceil(n/8) bytes
            (chunk i is bit i % 8, least significant first, of byte i // 8); otherwise empty.

Every read and write runs under a timeout, and a length is checked against its bound before
a single payload byte is read.
"""

from __future__ import annotations

import struct
from typing import Any

import trio

from p2prl.protocol import MAX_CHUNK_SIZE, MAX_CHUNKS

PROTOCOL_ID = "/p2prl/chunk/2.0.0"
OP_HAVE = 1
OP_GET = 2
OK = 0
NOT_FOUND = 1
BUSY = 2
BAD_REQUEST = 3
REQUEST_BYTES = 73
_REQ = struct.Struct(">B32s32sII")
_RESP = struct.Struct(">BI")
MAX_HAVE_PAYLOAD = 4 + (MAX_CHUNKS + 7) // 8
MAX_PAYLOAD = max(MAX_CHUNK_SIZE, MAX_HAVE_PAYLOAD)


class ProtocolError(Exception):
    """The remote side broke the protocol (bad framing, length out of bounds, early EOF)."""


def encode_request(op: int, blob_id: str, digest: str, index: int, chunk_size: int) -> bytes:
    return _REQ.pack(op, bytes.fromhex(blob_id), bytes.fromhex(digest), index, chunk_size)


def decode_request(data: bytes) -> tuple[int, str, str, int, int]:
    """(op, blob id, ref digest, index, chunk size)."""
    if len(data) != REQUEST_BYTES:
        raise ProtocolError(f"request of {len(data)} bytes")
    op, raw_id, raw_digest, index, chunk_size = _REQ.unpack(data)
    if op not in (OP_HAVE, OP_GET):
        raise ProtocolError(f"unknown op {op}")
    return op, raw_id.hex(), raw_digest.hex(), index, chunk_size


def encode_response_header(status: int, length: int) -> bytes:
    return _RESP.pack(status, length)


def encode_bitmap(have: list[bool]) -> bytes:
    out = bytearray((len(have) + 7) // 8)
    for i, h in enumerate(have):
        if h:
            out[i >> 3] |= 1 << (i & 7)
    return struct.pack(">I", len(have)) + bytes(out)


def decode_bitmap(payload: bytes, n_chunks: int) -> list[bool]:
    if len(payload) < 4:
        raise ProtocolError("bitmap too short")
    (n,) = struct.unpack(">I", payload[:4])
    if n != n_chunks or len(payload) != 4 + (n + 7) // 8:
        raise ProtocolError(f"bitmap for {n} chunks, expected {n_chunks}")
    bits = payload[4:]
    return [bool(bits[i >> 3] >> (i & 7) & 1) for i in range(n)]


async def read_exactly(stream: Any, n: int, timeout: float) -> bytes:
    """Read exactly ``n`` bytes or raise ProtocolError (EOF) / trio.TooSlowError (timeout)."""
    parts: list[bytes] = []
    got = 0
    with trio.fail_after(timeout):
        while got < n:
            b = await stream.read(n - got)
            if not b:
                raise ProtocolError(f"stream ended after {got} of {n} bytes")
            parts.append(b)
            got += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def write_all(stream: Any, data: bytes, timeout: float) -> None:
    with trio.fail_after(timeout):
        await stream.write(data)


async def read_response(stream: Any, max_len: int, timeout: float) -> tuple[int, bytes]:
    """One response; ``max_len`` bounds the payload we accept (checked before reading it)."""
    status, length = _RESP.unpack(await read_exactly(stream, _RESP.size, timeout))
    if status not in (OK, NOT_FOUND, BUSY, BAD_REQUEST):
        raise ProtocolError(f"unknown status {status}")
    if length > max_len:
        raise ProtocolError(f"payload of {length} bytes exceeds {max_len}")
    if status != OK and length:
        raise ProtocolError("non-OK response with a payload")
    payload = await read_exactly(stream, length, timeout) if length else b""
    return status, payload
