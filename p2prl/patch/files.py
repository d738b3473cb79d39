"""Diff and apply on safetensors files, writing outputs atomically (temp file, fsync, rename)."""

from __future__ import annotations

from pathlib import Path

import torch

from p2prl.atomicfile import write_atomic
from p2prl.patch.codec import PatchApplier, PatchEncoder, PatchStats
from p2prl.patch.errors import PatchError
from p2prl.patch.hashing import read_safetensors_header

READ_BLOCK = 4 * 1024 * 1024


def load_state_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file as a state dict; PatchError with the reason if it is not one."""
    from safetensors.torch import load

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise PatchError(f"cannot read {path}: {e.strerror or e}") from None
    read_safetensors_header(memoryview(data))
    try:
        return load(data)
    except Exception as e:  # the library raises several types on malformed input
        raise PatchError(f"{path} is not a valid safetensors file: {e}") from None


def save_state_file(state: dict[str, torch.Tensor], path: str | Path) -> None:
    from safetensors.torch import save

    write_atomic(path, [save({k: v.contiguous() for k, v in state.items()})])


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
        raise PatchError(f"cannot read {patch}: {e.strerror or e}") from None
    result = applier.finish()
    assert applier.result_hash is not None
    save_state_file(result, out)
    return applier.result_hash
