"""Diff and apply on safetensors files, writing outputs atomically (temp file, fsync, rename).

Files are read as ``RawTensor`` bit views of a memory map (no copy, no torch), so the file
commands cost little more than the diff itself.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from p2prl.atomicfile import write_atomic
from p2prl.patch.apply import PatchApplier
from p2prl.patch.dtypes import BY_NAME, RawTensor, TensorLike, dtype_of, shape_of, uint_view
from p2prl.patch.encode import PatchEncoder, PatchStats
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.hashing import read_safetensors_header

READ_BLOCK = 4 * 1024 * 1024


def load_state_file(path: str | Path) -> dict[str, RawTensor]:
    """A safetensors file as read-only bit views of its memory map; PatchError if it is not one."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise PatchError(PatchReason.UNAVAILABLE, f"cannot read {path}: {e.strerror or e}") from None
    entries, off = read_safetensors_header(memoryview(mm))
    buf = np.frombuffer(mm, dtype=np.uint8)
    out: dict[str, RawTensor] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        raw = buf[off + begin : off + end]
        out[name] = RawTensor(dtype, shape, raw.view(BY_NAME[dtype].uint))
    return out


def safetensors_bytes(state: dict[str, TensorLike]) -> list[bytes | memoryview]:
    """A state dict in the safetensors layout (u64 header length, JSON header, data), as parts.

    Written here rather than by the safetensors package because its numpy path has no bfloat16;
    ``read_safetensors_header`` is the matching reader, and the tests load the result with the
    safetensors package itself.
    """
    header: dict[str, object] = {}
    parts: list[bytes | memoryview] = []
    offset = 0
    for name in sorted(state):
        t = state[name]
        v = uint_view(t)
        header[name] = {
            "dtype": dtype_of(t).name,
            "shape": list(shape_of(t)),
            "data_offsets": [offset, offset + v.nbytes],
        }
        parts.append(memoryview(v).cast("B"))
        offset += v.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return [struct.pack("<Q", len(raw)), raw, *parts]


def save_state_file(state: dict[str, TensorLike], path: str | Path) -> None:
    """Write a state dict (RawTensor or torch tensors) as a safetensors file, atomically."""
    write_atomic(path, safetensors_bytes(state))


def diff_files(base: str | Path, new: str | Path, out: str | Path, *, zstd_level: int = 1) -> PatchStats:
    """Write the patch from ``base`` to ``new`` (safetensors files) to ``out``."""
    enc = PatchEncoder(load_state_file(base), load_state_file(new), zstd_level=zstd_level)
    write_atomic(out, enc.segments())
    return enc.stats


def apply_files(base: str | Path, patch: str | Path, out: str | Path) -> str:
    """Apply a patch file to a safetensors file; writes ``out`` only if every hash checks out.

    Returns the result's weights hash.
    """
    applier = PatchApplier(load_state_file(base))
    try:
        with open(patch, "rb") as f:
            for block in iter(lambda: f.read(READ_BLOCK), b""):
                applier.feed(block)
    except OSError as e:
        raise PatchError(PatchReason.UNAVAILABLE, f"cannot read {patch}: {e.strerror or e}") from None
    result = applier.finish()
    assert applier.result_hash is not None
    save_state_file(result, out)
    return applier.result_hash
