"""Reading a patch's header and framing without applying it: what ``p2prl patch inspect`` prints.

It checks the framing (header, every segment record, the end record and the patch digest) but
decodes no payload and needs no base, so it answers for a patch of any size in one pass.
"""

from __future__ import annotations

from typing import Any

import blake3

from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import (
    END,
    FORMAT_VERSION,
    INDEX_CODINGS,
    KIND_DENSE,
    KIND_END,
    KIND_SPARSE,
    PREAMBLE,
    RECORD_BYTES,
    VALUE_CODINGS,
    Header,
    parse_end,
    parse_header,
    parse_preamble,
    parse_segment,
)

__all__ = ["inspect_patch", "read_header"]


def read_header(patch: bytes | bytearray | memoryview) -> tuple[Header, int]:
    """The parsed header of a patch and the offset of its first record."""
    mv = memoryview(patch)
    if len(mv) < PREAMBLE.size:
        raise PatchError(PatchReason.MALFORMED, "truncated patch: shorter than its preamble")
    hlen = parse_preamble(mv[: PREAMBLE.size])
    if len(mv) < PREAMBLE.size + hlen:
        raise PatchError(PatchReason.MALFORMED, "truncated patch: header cut short")
    return parse_header(bytes(mv[PREAMBLE.size : PREAMBLE.size + hlen])), PREAMBLE.size + hlen


def inspect_patch(patch: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Header, per-tensor counts and sizes of a patch, JSON-able; checks framing, not contents."""
    mv = memoryview(patch)
    header, pos = read_header(mv)
    per = [
        {
            "name": s.name,
            "dtype": s.dtype,
            "shape": list(s.shape),
            "numel": s.numel,
            "changed": 0,
            "segments": 0,
            "dense_segments": 0,
            "index_bytes": 0,
            "value_bytes": 0,
            "value_codings": {"raw": 0, "delta": 0},
            "index_codings": {"leb128": 0, "u16esc": 0},
        }
        for s in header.tensors
    ]
    prev = (0, 0)
    n = 0
    result_hash = None
    while True:
        if len(mv) - pos >= 1 and mv[pos] == KIND_END:
            if len(mv) - pos < END.size:
                raise PatchError(PatchReason.MALFORMED, "truncated patch: end record cut short")
            count, result_hash, digest = parse_end(mv[pos : pos + END.size])
            if count != n:
                raise PatchError(
                    PatchReason.MALFORMED,
                    f"end record counts {count} segments, the patch holds {n}",
                )
            if digest != blake3.blake3(mv[:pos]).digest():
                raise PatchError(PatchReason.HASH_MISMATCH, "patch digest mismatch: the patch is corrupted")
            pos += END.size
            break
        if len(mv) - pos < RECORD_BYTES:
            raise PatchError(PatchReason.MALFORMED, "truncated patch: record cut short")
        rec = mv[pos : pos + RECORD_BYTES]
        pos += RECORD_BYTES
        seg = parse_segment(rec, header, prev)
        if len(mv) - pos < seg.payload_len:
            raise PatchError(PatchReason.MALFORMED, "truncated patch: segment payload cut short")
        pos += seg.payload_len
        prev = (seg.tensor, seg.start + seg.span)
        n += 1
        t = per[seg.tensor]
        t["changed"] += seg.count
        t["segments"] += 1
        t["dense_segments"] += seg.kind == KIND_DENSE
        t["index_bytes"] += seg.index_len
        t["value_bytes"] += seg.value_len
        t["value_codings"][VALUE_CODINGS[seg.value_coding]] += 1
        if seg.kind == KIND_SPARSE:
            t["index_codings"][INDEX_CODINGS[seg.index_coding]] += 1
    if pos != len(mv):
        raise PatchError(PatchReason.MALFORMED, "trailing bytes after the end of the patch")
    numel = sum(s.numel for s in header.tensors)
    changed = sum(t["changed"] for t in per)
    return {
        "format_version": FORMAT_VERSION,
        "codec": header.codec,
        "zstd_level": header.zstd_level,
        "base_hash": header.base_hash,
        "result_hash": result_hash,
        "bytes": len(mv),
        "tensors": per,
        "n_tensors": len(per),
        "segments": n,
        "numel": numel,
        "changed": changed,
        "changed_fraction": changed / numel if numel else 0.0,
        "bits_per_changed": 8 * len(mv) / changed if changed else 0.0,
    }
