"""Helpers shared by the patch tests: random states and exact (bitwise) comparison."""

from __future__ import annotations

import torch

from p2prl.patch.dtypes import uint_view


def random_state(
    shapes: dict[str, tuple[int, ...]], dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (0.02 * torch.randn(s, generator=g)).to(dtype) for k, s in shapes.items()}


def perturb(
    state: dict[str, torch.Tensor], density: float, seed: int = 1, ulps: bool = True
) -> dict[str, torch.Tensor]:
    """A copy where about ``density`` of the elements change (by ±1..3 ulp, or to random bits)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in state.items():
        new = t.clone()
        v = uint_view(new)
        if v.size:
            mask = (torch.rand(v.size, generator=g) < density).numpy()
            if ulps:
                step = torch.randint(1, 4, (v.size,), generator=g).numpy().astype(v.dtype)
                sign = (torch.rand(v.size, generator=g) < 0.5).numpy()
                v[mask & sign] += step[mask & sign]
                v[mask & ~sign] -= step[mask & ~sign]
            else:
                rnd = torch.randint(0, 2**15, (v.size,), generator=g).numpy().astype(v.dtype)
                v[mask] ^= rnd[mask] | 1
        out[k] = new
    return out


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            return False
        if not (uint_view(a[k]) == uint_view(b[k])).all():
            return False
    return True


def snapshot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}
