"""Reference implementation of PULSE's default codec, used only by the benchmark.

PULSE (grail) default: per tensor, the changed elements as 2-D COO coordinates, lexsorted;
row gaps as uint8 and column gaps as uint16 (int32 when a gap does not fit); the new values as
raw bf16 bits; everything concatenated and compressed with zstd-1. No hashes. Tensors of one
dimension are a single row; higher ones fold trailing dimensions into the columns.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import numpy as np
import zstandard

from p2prl.patch.dtypes import TensorLike, dtype_of, empty_like, shape_of, uint_view
from p2prl.patch.hashing import sorted_names


def _cols(shape: tuple[int, ...]) -> int:
    if len(shape) < 2:
        return max(1, int(np.prod(shape, dtype=np.int64)))
    return int(np.prod(shape[1:], dtype=np.int64))


def _narrow(a: np.ndarray, small: type[np.unsignedinteger]) -> tuple[str, bytes]:
    if a.size == 0 or int(a.max()) <= np.iinfo(small).max:
        return np.dtype(small).str, a.astype(small).tobytes()
    return "<i4", a.astype(np.int32).tobytes()


def pulse_encode(base: Mapping[str, TensorLike], new: Mapping[str, TensorLike], level: int = 1) -> bytes:
    meta: list[dict[str, object]] = []
    parts: list[bytes] = []
    for name in sorted_names(base):
        old, cur = uint_view(base[name]), uint_view(new[name])
        idx = np.flatnonzero(old != cur)
        if idx.size == 0:
            continue
        cols = _cols(shape_of(base[name]))
        rows, colv = np.divmod(idx, cols)
        row_gaps = np.diff(rows, prepend=0)
        col_gaps = np.diff(colv, prepend=0)
        new_row = np.ones(idx.size, dtype=bool)
        new_row[1:] = row_gaps[1:] != 0
        col_gaps[new_row] = colv[new_row]  # the first column of a row is absolute
        rdt, rb = _narrow(row_gaps, np.uint8)
        cdt, cb = _narrow(col_gaps, np.uint16)
        vb = cur[idx].tobytes()
        meta.append(
            {
                "name": name,
                "n": int(idx.size),
                "cols": cols,
                "rdt": rdt,
                "cdt": cdt,
                "dtype": dtype_of(base[name]).name,
            }
        )
        parts += [rb, cb, vb]
    head = json.dumps(meta).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(parts)
    return zstandard.ZstdCompressor(level=level).compress(payload)


def pulse_apply(base: Mapping[str, TensorLike], blob: bytes) -> dict[str, TensorLike]:
    """Decode and apply into copies of the touched tensors (no verification: PULSE has no hash)."""
    payload = zstandard.ZstdDecompressor().decompress(blob)
    (hlen,) = struct.unpack_from("<I", payload)
    meta = json.loads(payload[4 : 4 + hlen])
    pos = 4 + hlen
    out = dict(base)
    for m in meta:
        n, cols = m["n"], m["cols"]
        rdt, cdt = np.dtype(m["rdt"]), np.dtype(m["cdt"])
        row_gaps = np.frombuffer(payload, rdt, n, pos)
        pos += n * rdt.itemsize
        col_gaps = np.frombuffer(payload, cdt, n, pos).astype(np.int64)
        pos += n * cdt.itemsize
        t = empty_like(base[m["name"]])
        target = uint_view(t)
        np.copyto(target, uint_view(base[m["name"]]))
        vals = np.frombuffer(payload, target.dtype, n, pos)
        pos += n * target.dtype.itemsize
        rows = np.cumsum(row_gaps, dtype=np.int64)
        starts = np.ones(n, dtype=bool)
        starts[1:] = row_gaps[1:] != 0
        c = np.cumsum(col_gaps)
        offset = np.where(starts, c - col_gaps, 0)
        last = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
        colv = c - offset[last]
        target[rows * cols + colv] = vals
        out[m["name"]] = t
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m p2prl.bench.pulse_ref BASE NEW OUT``: the reference as a whole process (numpy,
    no torch), so ``p2prl bench patch-cli`` can race it against ``p2prl patch diff``."""
    import sys

    from p2prl.patch.files import load_state_file

    base_path, new_path, out = (argv if argv is not None else sys.argv[1:])[:3]
    blob = pulse_encode(load_state_file(base_path), load_state_file(new_path))
    with open(out, "wb") as f:
        f.write(blob)


if __name__ == "__main__":
    main()
