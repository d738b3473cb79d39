"""The publish's diff: the word-first path finds exactly what an element compare finds."""

from __future__ import annotations

import numpy as np
import pytest

from p2prl.patch.diff import MAX_WORD_SHARE, changes


def _expected(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pos = np.flatnonzero(old != new)
    return pos, new[pos], old[pos]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 1000, 4099])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.2, 0.9])
def test_changes_are_those_of_an_element_compare(dtype: type, size: int, density: float) -> None:
    rng = np.random.default_rng(size * 7 + int(density * 100))
    old = rng.integers(0, np.iinfo(dtype).max, size, dtype=dtype, endpoint=True)
    new = old.copy()
    moved = rng.random(size) < density
    new[moved] += rng.integers(1, 4, int(moved.sum()), dtype=dtype)
    want = _expected(old, new)
    count, changed = changes(old, new, size)
    assert count == want[0].size and changed is not None
    pos, nv, ov = changed
    assert pos.dtype == np.int64 and nv.dtype == old.dtype and ov.dtype == old.dtype
    for got, exp in zip((pos, nv, ov), want, strict=True):
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("density", [0.01, MAX_WORD_SHARE, 0.6])
def test_more_changes_than_the_limit_give_only_their_count(density: float) -> None:
    """Both paths (few changed words, many) return the count alone past the limit, and all of it
    up to the limit."""
    rng = np.random.default_rng(3)
    old = rng.integers(0, 1 << 16, 1 << 14, dtype=np.uint16)
    new = old.copy()
    new[rng.random(old.size) < density] ^= 1
    n = int(np.count_nonzero(old != new))
    assert changes(old, new, n - 1) == (n, None)
    count, changed = changes(old, new, n)
    assert count == n and changed is not None and changed.pos.size == n


def test_a_segment_of_unaligned_words_is_diffed_too() -> None:
    """A segment that starts one element into a tensor: its words are not 8-byte aligned."""
    rng = np.random.default_rng(5)
    base = rng.integers(0, 1 << 16, 4097, dtype=np.uint16)
    moved = base.copy()
    moved[rng.random(base.size) < 0.02] += 1
    old, new = base[1:], moved[1:]
    count, changed = changes(old, new, old.size)
    want = _expected(old, new)
    assert count == want[0].size and changed is not None
    for got, exp in zip(changed, want, strict=True):
        np.testing.assert_array_equal(got, exp)
