"""Thread-safe counters: bytes moved, drops by reason, bans (read by stats() from any thread)."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._c[key] += n

    def get(self, key: str) -> int:
        with self._lock:
            return self._c[key]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)
