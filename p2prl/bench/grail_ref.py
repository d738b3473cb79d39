"""grail's hidden-state sketch, kept as a reference to measure p2prl's fingerprint against (p2prl
does not use it; ``p2prl bench proof`` runs both on the same hidden states).

Per token: the 16 coordinates of the last hidden state largest in magnitude, each put in a signed
logarithmic bucket (8 per sign: ``int(log2(|x| + 1) * 8 / 10)`` clamped to 7, below 1e-6 zero),
dotted with 16 coefficients in [-127, 127] drawn from public randomness, mod 2^31 - 1. The miner
sends the sum and the 16 indices; the validator buckets its own state at those indices and accepts
a position when the modular distance of the two sums is within ``6000 + 5 sqrt(position)``. A
rollout passes when every challenged position (up to 32) does. The bucketed values stay within
±7, so the sums stay within ±16 x 127 x 7 = ±14,224.
"""

from __future__ import annotations

import math
from typing import Any

import blake3
import numpy as np

PRIME_Q = 2**31 - 1
TOPK = 16
BUCKETS = 8
COEFF = 127
TOL_BASE = 6000
TOL_GROWTH = 5.0
CHALLENGE_K = 32


def coefficients(randomness: bytes, k: int = TOPK) -> np.ndarray:
    """``k`` integer coefficients in [-COEFF, COEFF] from the public randomness."""
    raw = np.frombuffer(blake3.blake3(b"grail-sketch" + randomness).digest(length=2 * k), dtype=">i2")
    return (np.abs(raw.astype(np.int64)) % (2 * COEFF + 1)) - COEFF


def buckets(values: np.ndarray) -> np.ndarray:
    """Signed log-magnitude buckets in [-(BUCKETS-1), BUCKETS-1]."""
    a = np.abs(values.astype(np.float64))
    b = np.clip((np.log2(a + 1.0) * (BUCKETS / 10.0)).astype(np.int64), 0, BUCKETS - 1)
    b = np.where(values >= 0, b, -b)
    return np.where(a < 1e-6, 0, b)


def _as_array(hidden: Any) -> np.ndarray:
    if hasattr(hidden, "detach"):
        hidden = hidden.detach().float().cpu().numpy()
    return np.asarray(hidden, dtype=np.float32)


def commit(hidden: Any, coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The miner's side for ``[n, d]`` states: sums ``[n]`` (mod PRIME_Q) and top-k indices ``[n, k]``."""
    h = _as_array(hidden)
    idx = np.argsort(-np.abs(h), axis=1, kind="stable")[:, : len(coeffs)]
    vals = np.take_along_axis(h, idx, axis=1)
    return (buckets(vals) @ coeffs) % PRIME_Q, idx


def verify(
    hidden: Any, sums: np.ndarray, indices: np.ndarray, coeffs: np.ndarray, start: int = 0
) -> np.ndarray:
    """The validator's side: per position, whether its own state at the miner's indices gives a sum
    within tolerance of the miner's (``start``: sequence position of the first state)."""
    h = _as_array(hidden)
    mine = (buckets(np.take_along_axis(h, indices, axis=1)) @ coeffs) % PRIME_Q
    diff = np.abs(mine - sums)
    dist = np.minimum(diff, PRIME_Q - diff)
    tol = np.array([int(TOL_BASE + TOL_GROWTH * math.sqrt(start + p)) for p in range(len(sums))])
    return dist <= tol


def rollout_passes(
    miner_hidden: Any, validator_hidden: Any, coeffs: np.ndarray, rng: np.random.Generator, start: int = 0
) -> bool:
    """One rollout through grail's check: up to CHALLENGE_K positions picked at random."""
    sums, idx = commit(miner_hidden, coeffs)
    ok = verify(validator_hidden, sums, idx, coeffs, start)
    n = len(ok)
    picks = rng.choice(n, size=min(n, CHALLENGE_K), replace=False)
    return bool(ok[picks].all())
