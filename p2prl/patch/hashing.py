"""The weights hash: BLAKE3 over a canonical serialization of a state dict (docs/PROTOCOL.md §3).

It names a set of weights wherever the protocol needs to (patch base/result, manifests, genesis)
and is cheap enough to check on every apply: BLAKE3 runs at 4–9 GB/s here, faster than a diff.

Stream hashed, all integers little-endian::

    b"p2prl/weights/v1\\x00"  u32 n_tensors
    per tensor, names sorted by their UTF-8 bytes:
        u32 len(name) name  u8 len(dtype) dtype  u8 ndim  ndim x u64 dim  u64 nbytes  raw bytes
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from p2prl.patch.dtypes import BY_NAME, TensorLike, check_bool_bits, dtype_of, shape_of, uint_view
from p2prl.patch.errors import PatchError, PatchReason

DOMAIN = b"p2prl/weights/v1\x00"
MAX_SAFETENSORS_HEADER = 64 * 1024 * 1024


def entry_prefix(name: str, dtype: str, shape: Iterable[int], nbytes: int) -> bytes:
    """The bytes hashed before a tensor's data: shared by the hash here and the applier's running hash."""
    n = name.encode("utf-8")
    dims = tuple(int(s) for s in shape)
    return (
        struct.pack("<I", len(n))
        + n
        + bytes([len(dtype)])
        + dtype.encode("ascii")
        + bytes([len(dims)])
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<Q", nbytes)
    )


def sorted_names(names: Iterable[str]) -> list[str]:
    """The canonical tensor order: by UTF-8 bytes (not by Python's code-point order of str)."""
    return sorted(names, key=lambda s: s.encode("utf-8"))


def weights_hash(state: Mapping[str, TensorLike], *, threads: int | None = None) -> str:
    """BLAKE3 hex of the canonical serialization of ``state`` (contiguous tensors; one on another
    device is read back to the host one tensor at a time, so hashing a CUDA model holds one tensor's
    copy at most). ``threads``: at most this many hashing threads (default: BLAKE3's choice)."""
    return _digest(blake3.blake3(max_threads=blake3.blake3.AUTO if threads is None else max(1, threads)), state)


def weights_sha256(state: Mapping[str, TensorLike]) -> str:
    """SHA-256 hex of the same byte stream as :func:`weights_hash`: the ``weights_sha256`` a node
    reports, so that tools without BLAKE3 can compare weights too."""
    return _digest(hashlib.sha256(), state)


def _digest(h: Any, state: Mapping[str, TensorLike]) -> str:
    h.update(DOMAIN + struct.pack("<I", len(state)))
    for name in sorted_names(state):
        t = _on_host(state[name])
        d = dtype_of(t)
        v = uint_view(t)
        check_bool_bits(d.name, v, name)
        h.update(entry_prefix(name, d.name, shape_of(t), v.nbytes))
        if v.nbytes:
            h.update(memoryview(v).cast("B"))
    return h.hexdigest()


def _on_host(t: TensorLike) -> TensorLike:
    device = getattr(t, "device", None)
    if device is not None and device.type != "cpu":
        return t.detach().to("cpu")  # type: ignore[union-attr]
    return t


def read_safetensors_header(
    buf: memoryview | bytes,
) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], int]:
    """Parse and bound-check a safetensors header: name -> (dtype, shape, begin, end), data offset."""
    if len(buf) < 8:
        raise PatchError(PatchReason.MALFORMED, "not a safetensors file: shorter than 8 bytes")
    (hlen,) = struct.unpack("<Q", bytes(buf[:8]))
    if hlen > MAX_SAFETENSORS_HEADER or 8 + hlen > len(buf):
        raise PatchError(PatchReason.MALFORMED, "not a safetensors file: bad header length")
    try:
        header = json.loads(bytes(buf[8 : 8 + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PatchError(PatchReason.MALFORMED, f"not a safetensors file: {e}") from None
    if not isinstance(header, dict):
        raise PatchError(PatchReason.MALFORMED, "not a safetensors file: header is not an object")
    data_len = len(buf) - 8 - hlen
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise PatchError(PatchReason.MALFORMED, f"safetensors entry {name!r} is malformed") from None
        if dtype not in BY_NAME or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise PatchError(
                PatchReason.MALFORMED,
                f"safetensors entry {name!r} has an unsupported dtype or shape",
            )
        nbytes = int(np.prod(shape, dtype=np.int64)) * BY_NAME[dtype].itemsize
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_len):
            raise PatchError(PatchReason.MALFORMED, f"safetensors entry {name!r} lies outside the file")
        if end - begin != nbytes:
            raise PatchError(
                PatchReason.MALFORMED,
                f"safetensors entry {name!r} has {end - begin} bytes, its shape needs {nbytes}",
            )
        out[name] = (dtype, shape, begin, end)
    return out, 8 + hlen


def weights_hash_file(path: str | Path) -> str:
    """The weights hash of a safetensors file, hashing its bytes in place (mmap, no tensor copies)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise PatchError(PatchReason.MALFORMED, "not a safetensors file: empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mv = memoryview(mm)
            try:
                entries, off = read_safetensors_header(mv)
                h = blake3.blake3(max_threads=blake3.blake3.AUTO)
                h.update(DOMAIN + struct.pack("<I", len(entries)))
                for name in sorted_names(entries):
                    dtype, shape, begin, end = entries[name]
                    h.update(entry_prefix(name, dtype, shape, end - begin))
                    if dtype == "BOOL":  # a copy: an error's traceback must not pin the map open
                        check_bool_bits(dtype, np.frombuffer(bytes(mv[off + begin : off + end]), np.uint8), name)
                    if end > begin:
                        h.update(mv[off + begin : off + end])
                return h.hexdigest()
            finally:
                mv.release()
