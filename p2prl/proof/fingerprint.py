"""Hidden-state fingerprints: a few bytes per completion token that pin the model that produced it.

For every completion token the miner projects the direction ``u = h / ‖h‖`` of the last hidden state
(the state whose logits produced the token) onto ``m`` random ±1 vectors drawn from the version's
manifest hash, so the projections cannot be computed before the version exists. Each projection
``p = <r, u>`` is ~N(0, 1) for an arbitrary direction; the miner stores ``round(p * SCALE) mod 256``
(one byte). The validator recomputes ``p'`` from its own forward pass and reads the wrapped difference
``(q - q') mod 256`` in ``[-128, 128)``: for the same model it is ``SCALE * <r, u - u'>``, i.e. noise
with standard deviation ``SCALE * ‖u - u'‖`` — the relative error of the hidden state, which honest
numeric drift keeps near 1% — while another model's state gives a uniformly random byte (rms ≈ 74,
i.e. a relative error ≈ 0.14). The root mean square over many projections is therefore an estimate
of ``‖u - u'‖`` that the validator compares with a tolerance (see docs/PROOF.md for the numbers).

Only the low byte is kept because the high bits carry nothing the comparison needs: an honest
difference is a few units, so the wrap-around never hides it, and a wrong state is caught by the
low byte alone.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import blake3
import numpy as np

SKETCH_DIM = 16  # projections (bytes) per token
SCALE = 512.0  # quantization steps per unit of projection; wrap range ±0.25
DOMAIN = b"p2prl-fingerprint-v1"
MAX_HIDDEN = 1 << 16


@lru_cache(maxsize=8)
def projection(manifest_hash: str, d: int, m: int = SKETCH_DIM) -> np.ndarray:
    """``[m, d]`` float32 matrix of ±1 drawn from BLAKE3-XOF(domain ‖ manifest hash ‖ d ‖ m)."""
    if not 0 < d <= MAX_HIDDEN or not 0 < m <= 255:
        raise ValueError("bad projection shape")
    key = DOMAIN + bytes.fromhex(manifest_hash) + d.to_bytes(4, "big") + m.to_bytes(1, "big")
    bits = np.unpackbits(np.frombuffer(blake3.blake3(key).digest(length=(m * d + 7) // 8), dtype=np.uint8))
    signs = bits[: m * d].astype(np.float32) * 2.0 - 1.0
    signs.setflags(write=False)
    return signs.reshape(m, d)


def _as_array(hidden: Any) -> np.ndarray:
    if hasattr(hidden, "detach"):
        hidden = hidden.detach().float().cpu().numpy()
    a = np.asarray(hidden, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError("hidden states must be [n, d]")
    return a


def projections(hidden: Any, manifest_hash: str, m: int = SKETCH_DIM) -> np.ndarray:
    """``[n, m]`` float32 projections of the normalized hidden states (before quantization)."""
    h = _as_array(hidden)
    norms = np.linalg.norm(h, axis=1, keepdims=True)
    u = h / np.maximum(norms, 1e-12)
    return u @ projection(manifest_hash, h.shape[1], m).T


def sketch(hidden: Any, manifest_hash: str, m: int = SKETCH_DIM) -> np.ndarray:
    """The miner's commitment for ``[n, d]`` hidden states: ``[n, m]`` uint8."""
    q = np.rint(projections(hidden, manifest_hash, m) * SCALE).astype(np.int64)
    return (q & 0xFF).astype(np.uint8)


def differences(claimed: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
    """Wrapped differences ``(claimed - recomputed) mod 256`` in ``[-128, 128)``, in projection units."""
    if claimed.shape != recomputed.shape:
        raise ValueError("sketch shapes differ")
    d = (claimed.astype(np.int16) - recomputed.astype(np.int16)) & 0xFF
    return (np.where(d >= 128, d - 256, d)).astype(np.float64) / SCALE


def relative_error(claimed: np.ndarray, recomputed: np.ndarray) -> float:
    """Estimate of ``‖u - u'‖`` (the hidden state's relative error) from the sketches; 0 if empty."""
    d = differences(claimed, recomputed)
    return float(np.sqrt(np.mean(d * d))) if d.size else 0.0
