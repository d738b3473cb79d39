"""The one bounded mapping: every table a peer can grow (replay digests, token buckets, seen rollouts,
strikes, verdict state) holds at most ``capacity`` keys and forgets the oldest first, so no flood of
new keys makes a node hold more.

Storing a key keeps its place, as a dict does (first-in first-out); ``put`` or ``touch`` makes it the
newest (least-recently-used order). The eviction happens inside the store, so no caller can forget it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(OrderedDict[K, V], Generic[K, V]):
    """An ordered dict of at most ``capacity`` keys; ``on_evict(key, value)`` hears of each one dropped."""

    def __init__(self, capacity: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        super().__init__()
        self.capacity = capacity
        self.on_evict = on_evict

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        while len(self) > self.capacity:
            k, v = self.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(k, v)

    def put(self, key: K, value: V) -> None:
        """Store ``value`` as the newest entry."""
        self[key] = value
        self.move_to_end(key)

    def touch(self, key: K) -> None:
        """Make ``key`` (which must be held) the newest entry."""
        self.move_to_end(key)

    def copy(self) -> LRU[K, V]:
        out: LRU[K, V] = LRU(self.capacity, self.on_evict)
        out.update(self)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        items: Iterator[tuple[K, V]] = iter(list(self.items()))
        return (type(self), (self.capacity, self.on_evict), None, None, items)
