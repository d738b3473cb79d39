"""Tensor dtypes the patch format and weights hash know, by their safetensors names.

The codec only ever looks at tensors through an unsigned integer view of the same width, so it
compares and rebuilds bit patterns exactly and never does float arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2prl.patch.errors import PatchError


@dataclass(frozen=True)
class DType:
    name: str  # safetensors dtype name, also used on the wire
    torch_dtype: torch.dtype
    itemsize: int
    view_dtype: torch.dtype  # a signed integer torch dtype of the same width (numpy-convertible)
    uint: type[np.unsignedinteger]  # numpy unsigned integer of the same width


_TABLE = (
    DType("BF16", torch.bfloat16, 2, torch.int16, np.uint16),
    DType("F16", torch.float16, 2, torch.int16, np.uint16),
    DType("F32", torch.float32, 4, torch.int32, np.uint32),
    DType("F64", torch.float64, 8, torch.int64, np.uint64),
    DType("I8", torch.int8, 1, torch.int8, np.uint8),
    DType("U8", torch.uint8, 1, torch.int8, np.uint8),
    DType("I16", torch.int16, 2, torch.int16, np.uint16),
    DType("I32", torch.int32, 4, torch.int32, np.uint32),
    DType("I64", torch.int64, 8, torch.int64, np.uint64),
    DType("BOOL", torch.bool, 1, torch.int8, np.uint8),
)
BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
BY_TORCH: dict[torch.dtype, DType] = {d.torch_dtype: d for d in _TABLE}


def dtype_of(t: torch.Tensor) -> DType:
    try:
        return BY_TORCH[t.dtype]
    except KeyError:
        raise PatchError(f"unsupported dtype {t.dtype}") from None


def dtype_named(name: str) -> DType:
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise PatchError(f"unsupported dtype {name!r}") from None


def uint_view(t: torch.Tensor) -> np.ndarray:
    """A flat unsigned-integer numpy view sharing memory with a contiguous CPU tensor."""
    d = dtype_of(t)
    if t.device.type != "cpu":
        raise PatchError("tensors must be on the CPU")
    if not t.is_contiguous():
        raise PatchError("tensors must be contiguous")
    src = t.detach()
    if d.torch_dtype is torch.bool or d.torch_dtype is torch.uint8:
        src = src.view(torch.uint8)
        return src.numpy().reshape(-1)
    return src.view(d.view_dtype).numpy().reshape(-1).view(d.uint)
