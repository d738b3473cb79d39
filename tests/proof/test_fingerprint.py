"""Fingerprints: deterministic public projections, and an error estimate that tells drift from another model."""

from __future__ import annotations

import numpy as np

from p2prl.proof.fingerprint import SKETCH_DIM, differences, projection, projections, relative_error, sketch

MH = "12" * 32


def test_projection_is_public_and_version_bound() -> None:
    a = projection(MH, 64)
    assert a.shape == (SKETCH_DIM, 64) and set(np.unique(a)) == {-1.0, 1.0}
    assert np.array_equal(a, projection(MH, 64))
    assert not np.array_equal(a, projection("13" * 32, 64))


def test_error_estimate_tracks_relative_error() -> None:
    rng = np.random.default_rng(0)
    h = rng.normal(size=(400, 256)).astype(np.float32)
    assert relative_error(sketch(h, MH), sketch(h, MH)) == 0.0
    noise = rng.normal(size=h.shape).astype(np.float32)
    noise *= 0.01 * np.linalg.norm(h, axis=1, keepdims=True) / np.linalg.norm(noise, axis=1, keepdims=True)
    est = relative_error(sketch(h + noise, MH), sketch(h, MH))
    assert 0.008 < est < 0.012
    other = rng.normal(size=h.shape).astype(np.float32)
    assert relative_error(sketch(other, MH), sketch(h, MH)) > 0.1
    # scale does not matter: the direction is fingerprinted
    assert relative_error(sketch(3 * h, MH), sketch(h, MH)) < 0.002


def test_wrapped_differences() -> None:
    a = np.array([[250, 3]], dtype=np.uint8)
    b = np.array([[2, 250]], dtype=np.uint8)
    d = differences(a, b) * 512
    assert d.tolist() == [[-8.0, 9.0]]
    p = projections(np.ones((1, 8), dtype=np.float32), MH, 4)
    assert p.shape == (1, 4) and np.all(np.abs(p) <= np.sqrt(8) + 1e-5)
