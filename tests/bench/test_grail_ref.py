"""The reference implementation of grail's sketch behaves as specified (so the benchmark's
comparison measures grail's scheme, not a bug of ours)."""

from __future__ import annotations

import numpy as np

from p2prl.bench import grail_ref as G


def test_buckets_are_signed_log_magnitudes() -> None:
    x = np.array([0.0, 1e-7, 0.5, -0.5, 1.0, -3.0, 100.0, -1e9])
    # int(log2(|x|+1) * 0.8), clamped to 7, signed; below 1e-6 zero
    assert G.buckets(x).tolist() == [0, 0, 0, 0, 0, -1, 5, -7]
    assert np.all(np.abs(G.buckets(np.random.default_rng(0).normal(0, 50, 1000))) <= G.BUCKETS - 1)


def test_coefficients_are_bounded_and_follow_the_randomness() -> None:
    a, b = G.coefficients(b"\x01" * 32), G.coefficients(b"\x02" * 32)
    assert a.shape == (G.TOPK,) and np.all(np.abs(a) <= G.COEFF)
    assert np.array_equal(a, G.coefficients(b"\x01" * 32)) and not np.array_equal(a, b)


def test_commit_and_verify() -> None:
    rng = np.random.default_rng(1)
    h = rng.normal(0, 3, size=(40, 256)).astype(np.float32)
    c = G.coefficients(b"r" * 32)
    sums, idx = G.commit(h, c)
    assert idx.shape == (40, G.TOPK)
    assert np.all(np.abs(np.take_along_axis(h, idx, 1)).min(1) >= np.sort(np.abs(h), 1)[:, -G.TOPK])
    raw = G.buckets(np.take_along_axis(h, idx, 1)) @ c
    assert np.all(np.abs(raw) <= G.TOPK * G.COEFF * (G.BUCKETS - 1))  # the ±14,224 range
    assert G.verify(h, sums, idx, c).all()  # the same states pass
    far = (sums + 10_000) % G.PRIME_Q  # a sum off by more than the tolerance fails
    assert not G.verify(h, far, idx, c).any()
    assert G.rollout_passes(h, h, c, np.random.default_rng(0))
