"""The bounded mapping: never more than its capacity, oldest out first, LRU order only when asked."""

from __future__ import annotations

import copy
import pickle

import pytest

from p2prl.lru import LRU


def test_store_keeps_place_put_and_touch_refresh() -> None:
    dropped: list[tuple[str, int]] = []
    d: LRU[str, int] = LRU(3, on_evict=lambda k, v: dropped.append((k, v)))
    for i, k in enumerate("abc"):
        d[k] = i
    d["a"] = 10  # a plain store keeps a's place: it is still the oldest
    d["x"] = 3
    assert list(d) == ["b", "c", "x"] and dropped == [("a", 10)]
    d.put("b", 11)  # put makes it the newest
    d.touch("c")
    d["y"] = 4
    assert list(d.items()) == [("b", 11), ("c", 2), ("y", 4)] and dropped[-1] == ("x", 3)
    for i in range(100):
        d[f"k{i}"] = i
        assert len(d) <= 3


def test_copies_keep_the_bound() -> None:
    d: LRU[str, int] = LRU(2)
    d.update(a=1, b=2)
    for c in (d.copy(), copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        assert list(c.items()) == [("a", 1), ("b", 2)] and c.capacity == 2
        c["z"] = 3
        assert list(c) == ["b", "z"]
    assert list(d) == ["a", "b"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LRU(0)
