"""Byte layout of a patch (docs/PROTOCOL.md §4): constants, record structs, and the bounds a
decoder enforces before it allocates anything a hostile patch declares."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import zstandard

from p2prl.crypto import CanonicalError, canonical_bytes, canonical_loads
from p2prl.patch.dtypes import BY_NAME
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.protocol import is_hex

MAGIC = b"P2PT"
FORMAT_VERSION = 1
CODEC = "p2prl-sparse-v1"
PREAMBLE = struct.Struct("<4sHI")  # magic, format version, header length
SEGMENT = struct.Struct("<BBBBIQIIIIII")  # 40 bytes
END = struct.Struct("<BBBBI32s32s")  # 72 bytes: kind, 3 zero, count, result hash, patch digest
RECORD_BYTES = SEGMENT.size

KIND_SPARSE = 1
KIND_DENSE = 2
KIND_END = 0xFF
VALUE_RAW = 0  # the new bit patterns
VALUE_DELTA = 1  # zig-zag of (new - old) mod 2^w on the bit patterns
INDEX_NONE = 0  # dense segments carry no indices
INDEX_LEB128 = 1
INDEX_U16ESC = 2
VALUE_CODINGS = {VALUE_RAW: "raw", VALUE_DELTA: "delta"}
INDEX_CODINGS = {INDEX_NONE: "none", INDEX_LEB128: "leb128", INDEX_U16ESC: "u16esc"}

MAX_HEADER_BYTES = 8 * 1024 * 1024
MAX_TENSORS = 65536
MAX_NAME_BYTES = 1024
MAX_NDIM = 8
MAX_NUMEL = 1 << 40
SEGMENT_SPAN = 1 << 22  # what the encoder uses
MAX_SPAN = 1 << 24  # what a decoder accepts
MAX_STREAM_BYTES = MAX_SPAN * 8 + (1 << 20)  # bound on any one compressed or raw stream
HASH_HEX_LEN = 64
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def to_body(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape)]


@dataclass(frozen=True)
class Header:
    base_hash: str
    tensors: tuple[TensorSpec, ...]
    zstd_level: int
    codec: str = CODEC

    def to_bytes(self) -> bytes:
        body = canonical_bytes(
            {
                "codec": self.codec,
                "base_hash": self.base_hash,
                "zstd_level": self.zstd_level,
                "tensors": [t.to_body() for t in self.tensors],
            }
        )
        if len(body) > MAX_HEADER_BYTES:
            raise PatchError(PatchReason.BAD_INPUT, "patch header too large")
        return PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(body)) + body


def parse_preamble(buf: bytes | memoryview) -> int:
    """Checks magic and version of the first 10 bytes; returns the declared header length."""
    magic, version, hlen = PREAMBLE.unpack(bytes(buf[: PREAMBLE.size]))
    if magic != MAGIC:
        raise PatchError(PatchReason.MALFORMED, "not a p2prl patch (bad magic)")
    if version != FORMAT_VERSION:
        raise PatchError(PatchReason.UNSUPPORTED, f"unsupported patch format version {version}")
    if hlen > MAX_HEADER_BYTES:
        raise PatchError(PatchReason.MALFORMED, f"patch header of {hlen} bytes exceeds {MAX_HEADER_BYTES}")
    return hlen


def _is_hash(v: Any) -> bool:
    return is_hex(v, HASH_HEX_LEN // 2)


def parse_header(body: bytes) -> Header:
    try:
        h = canonical_loads(body, max_bytes=MAX_HEADER_BYTES)
    except CanonicalError as e:
        raise PatchError(PatchReason.MALFORMED, f"patch header is not canonical JSON: {e.detail}") from None
    if not isinstance(h, dict) or set(h) != {"codec", "base_hash", "zstd_level", "tensors"}:
        raise PatchError(PatchReason.MALFORMED, "patch header has the wrong fields")
    if h["codec"] != CODEC:
        raise PatchError(PatchReason.UNSUPPORTED, f"unsupported codec {h['codec']!r}")
    if not _is_hash(h["base_hash"]):
        raise PatchError(PatchReason.MALFORMED, "patch header base_hash is not a 32-byte hex hash")
    lvl = h["zstd_level"]
    if not isinstance(lvl, int) or isinstance(lvl, bool) or not -7 <= lvl <= 22:
        raise PatchError(PatchReason.MALFORMED, "patch header zstd_level out of range")
    ts = h["tensors"]
    if not isinstance(ts, list) or len(ts) > MAX_TENSORS:
        raise PatchError(PatchReason.MALFORMED, f"patch header must list at most {MAX_TENSORS} tensors")
    specs = []
    prev: bytes | None = None
    for t in ts:
        if not (isinstance(t, list) and len(t) == 3):
            raise PatchError(PatchReason.MALFORMED, "patch header tensor entry malformed")
        name, dtype, shape = t
        if (
            not isinstance(name, str)
            or not 0 < len(nb := name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES
        ):
            raise PatchError(PatchReason.MALFORMED, "patch header tensor name empty or too long")
        if prev is not None and nb <= prev:
            raise PatchError(PatchReason.MALFORMED, "patch header tensor names not sorted and distinct")
        prev = nb
        if dtype not in BY_NAME:
            raise PatchError(PatchReason.UNSUPPORTED, f"patch header dtype {dtype!r} unsupported")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            raise PatchError(PatchReason.MALFORMED, "patch header shape malformed")
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_NUMEL for s in shape):
            raise PatchError(PatchReason.MALFORMED, "patch header shape malformed")
        spec = TensorSpec(name, dtype, tuple(shape))
        if spec.numel > MAX_NUMEL:
            raise PatchError(PatchReason.MALFORMED, "patch header tensor too large")
        specs.append(spec)
    return Header(base_hash=h["base_hash"], tensors=tuple(specs), zstd_level=lvl)


@dataclass(frozen=True)
class SegmentHead:
    kind: int
    value_coding: int
    index_coding: int
    tensor: int
    start: int
    span: int
    count: int
    index_raw: int
    index_len: int
    value_raw: int
    value_len: int

    def pack(self) -> bytes:
        return SEGMENT.pack(
            self.kind,
            self.value_coding,
            self.index_coding,
            0,
            self.tensor,
            self.start,
            self.span,
            self.count,
            self.index_raw,
            self.index_len,
            self.value_raw,
            self.value_len,
        )

    @property
    def payload_len(self) -> int:
        return self.index_len + self.value_len


def parse_segment(rec: bytes | memoryview, header: Header, prev_end: tuple[int, int]) -> SegmentHead:
    """Unpack a segment record and check every field against the header and bounds."""
    k, vc, ic, rsv, ti, start, span, count, iraw, ilen, vraw, vlen = SEGMENT.unpack(bytes(rec))
    if rsv != 0:
        raise PatchError(PatchReason.MALFORMED, "segment reserved byte is not zero")
    if k not in (KIND_SPARSE, KIND_DENSE):
        raise PatchError(PatchReason.MALFORMED, f"unknown segment kind {k}")
    if vc not in VALUE_CODINGS:
        raise PatchError(PatchReason.MALFORMED, f"unknown value coding {vc}")
    if ti >= len(header.tensors):
        raise PatchError(PatchReason.MALFORMED, f"segment names tensor {ti} of {len(header.tensors)}")
    spec = header.tensors[ti]
    w = BY_NAME[spec.dtype].itemsize
    if not 0 < span <= MAX_SPAN or start + span > spec.numel:
        raise PatchError(
            PatchReason.MALFORMED,
            f"segment range {start}+{span} outside {spec.name} ({spec.numel} elements)",
        )
    if (ti, start) < prev_end:
        raise PatchError(PatchReason.MALFORMED, "segments out of order or overlapping")
    if not 0 < count <= span:
        raise PatchError(PatchReason.MALFORMED, "segment count out of range")
    if k == KIND_SPARSE:
        if ic not in (INDEX_LEB128, INDEX_U16ESC):
            raise PatchError(PatchReason.MALFORMED, f"unknown index coding {ic}")
        max_iraw = 5 * count if ic == INDEX_LEB128 else 6 * count
        if not count <= iraw <= max_iraw or vraw != count * w:
            raise PatchError(PatchReason.MALFORMED, "segment stream sizes do not match its count")
    else:
        if ic != INDEX_NONE or iraw != 0 or ilen != 0 or vraw != span * w:
            raise PatchError(PatchReason.MALFORMED, "dense segment stream sizes do not match its span")
    if ilen > MAX_STREAM_BYTES or vlen > MAX_STREAM_BYTES or (iraw and not ilen) or not vlen:
        raise PatchError(PatchReason.MALFORMED, "segment stream length out of range")
    return SegmentHead(k, vc, ic, ti, start, span, count, iraw, ilen, vraw, vlen)


def parse_end(rec: bytes | memoryview) -> tuple[int, str, bytes]:
    """(segment count, result weights hash hex, BLAKE3 digest of every byte before the end record)."""
    k, r1, r2, r3, n, result, digest = END.unpack(bytes(rec))
    if k != KIND_END or r1 or r2 or r3:
        raise PatchError(PatchReason.MALFORMED, "bad end record")
    return n, result.hex(), digest


def end_record(n_segments: int, result_hash: str, digest: bytes) -> bytes:
    return END.pack(KIND_END, 0, 0, 0, n_segments, bytes.fromhex(result_hash), digest)


def zstd_unpack(frame: bytes | memoryview, raw_len: int) -> bytes:
    """Decompress one zstd frame that must declare and produce exactly ``raw_len`` bytes.

    The declared content size is checked before decompressing, so a frame claiming (or a bomb
    expanding to) more than the segment allows never allocates more than ``raw_len``.
    """
    if raw_len == 0:
        if len(frame):
            raise PatchError(PatchReason.MALFORMED, "stream of declared size 0 is not empty")
        return b""
    if bytes(frame[:4]) != ZSTD_MAGIC:
        raise PatchError(PatchReason.MALFORMED, "stream is not a zstd frame")
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as e:
        raise PatchError(PatchReason.MALFORMED, f"bad zstd frame: {e}") from None
    if params.content_size != raw_len:
        raise PatchError(
            PatchReason.MALFORMED,
            f"zstd frame declares {params.content_size} bytes, segment says {raw_len}",
        )
    try:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out = dobj.decompress(frame)
    except zstandard.ZstdError as e:
        raise PatchError(PatchReason.MALFORMED, f"bad zstd frame: {e}") from None
    if not dobj.eof or dobj.unused_data:
        raise PatchError(PatchReason.MALFORMED, "zstd stream is truncated or has trailing bytes")
    if len(out) != raw_len:
        raise PatchError(PatchReason.MALFORMED, "zstd frame decompressed to the wrong size")
    return out
