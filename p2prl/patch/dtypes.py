"""Tensor dtypes the patch format and weights hash know, by their safetensors names.

The codec only ever looks at tensors through an unsigned integer view of the same width, so it
compares and rebuilds bit patterns exactly and never does float arithmetic. That view needs no
torch: a ``RawTensor`` (dtype name, shape, flat unsigned view) is what the file commands
(``p2prl patch diff|apply|inspect``) work on, so they never pay torch's import. torch tensors are
accepted wherever a RawTensor is; torch is only touched when one is passed (it is then loaded).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from p2prl.patch.errors import PatchError, PatchReason

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str  # safetensors dtype name, also used on the wire
    torch_name: str  # the torch dtype's attribute name (resolved only when torch is in use)
    itemsize: int
    view_name: str  # a signed integer torch dtype of the same width (numpy-convertible)
    uint: type[np.unsignedinteger]  # numpy unsigned integer of the same width


_TABLE = (
    DType("BF16", "bfloat16", 2, "int16", np.uint16),
    DType("F16", "float16", 2, "int16", np.uint16),
    DType("F32", "float32", 4, "int32", np.uint32),
    DType("F64", "float64", 8, "int64", np.uint64),
    DType("I8", "int8", 1, "int8", np.uint8),
    DType("U8", "uint8", 1, "int8", np.uint8),
    DType("I16", "int16", 2, "int16", np.uint16),
    DType("I32", "int32", 4, "int32", np.uint32),
    DType("I64", "int64", 8, "int64", np.uint64),
    DType("BOOL", "bool", 1, "int8", np.uint8),
)
BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
_BY_TORCH_NAME: dict[str, DType] = {d.torch_name: d for d in _TABLE}


@dataclass(frozen=True)
class RawTensor:
    """A tensor as bits: its safetensors dtype name, shape and a flat unsigned-integer view."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        d = dtype_named(self.dtype)
        numel = int(np.prod(self.shape, dtype=np.int64))
        if self.data.dtype != d.uint or self.data.ndim != 1 or self.data.size != numel:
            raise PatchError(
                PatchReason.MALFORMED,
                f"raw tensor data does not match {self.dtype}{list(self.shape)}",
            )

    @classmethod
    def empty(cls, dtype: str, shape: tuple[int, ...]) -> RawTensor:
        d = dtype_named(dtype)
        return cls(dtype, tuple(shape), np.empty(int(np.prod(shape, dtype=np.int64)), dtype=d.uint))


TensorLike: TypeAlias = "torch.Tensor | RawTensor"


def _is_torch(t: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(t, torch.Tensor)


def dtype_of(t: Any) -> DType:
    if isinstance(t, RawTensor):
        return dtype_named(t.dtype)
    if not _is_torch(t):
        raise PatchError(PatchReason.BAD_INPUT, f"not a tensor: {type(t).__name__}")
    d = _BY_TORCH_NAME.get(str(t.dtype).removeprefix("torch."))
    if d is None:
        raise PatchError(PatchReason.UNSUPPORTED, f"unsupported dtype {t.dtype}")
    return d


def dtype_named(name: str) -> DType:
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise PatchError(PatchReason.UNSUPPORTED, f"unsupported dtype {name!r}") from None


def shape_of(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def uint_view(t: Any) -> np.ndarray:
    """A flat unsigned-integer numpy view sharing memory with a contiguous CPU tensor."""
    d = dtype_of(t)
    if isinstance(t, RawTensor):
        return t.data
    import torch

    if t.device.type != "cpu":
        raise PatchError(PatchReason.BAD_INPUT, "tensors must be on the CPU")
    if not t.is_contiguous():
        raise PatchError(PatchReason.BAD_INPUT, "tensors must be contiguous")
    src = t.detach()
    if d.torch_name in ("bool", "uint8"):
        return src.view(torch.uint8).numpy().reshape(-1)
    return src.view(getattr(torch, d.view_name)).numpy().reshape(-1).view(d.uint)


def check_bool_bits(dtype: str, bits: np.ndarray, what: str) -> None:
    """A ``BOOL`` element is one byte, 0 or 1 (docs/PROTOCOL.md §4): any other byte is refused, so
    one truth value never has two bit patterns (and two weights hashes)."""
    if dtype == "BOOL" and bits.size and int(bits.max()) > 1:
        raise PatchError(PatchReason.MALFORMED, f"{what}: a BOOL element is neither 0 nor 1")


def changed_fraction(prev: Mapping[str, Any], new: Mapping[str, Any]) -> float:
    """Fraction of elements whose bit pattern differs between two states of the same names and shapes:
    what a patch carries (-0.0 and 0.0 differ; no float arithmetic)."""
    changed = total = 0
    for name, a in prev.items():
        ua, ub = uint_view(a), uint_view(new[name])
        changed += int(np.count_nonzero(ua != ub))
        total += ua.size
    return changed / max(total, 1)


def empty_like(t: Any) -> Any:
    """A new contiguous tensor of ``t``'s kind (RawTensor or torch), dtype and shape."""
    if isinstance(t, RawTensor):
        return RawTensor.empty(t.dtype, t.shape)
    import torch

    return torch.empty_like(t, memory_format=torch.contiguous_format)
