"""Bans that expire: a peer cut off for misbehaving gets another chance after ``ban_s``.

A ban is for good behaviour's sake, not a verdict for ever: a peer framed by a forged input, or
one that restarted with a fixed bug, must not stay cut off (docs/SECURITY.md, item 2). The list
is bounded; when full, the ban closest to expiry is lifted first.
"""

from __future__ import annotations

import time


class BanList:
    """peer id -> expiry (monotonic). ``peer in bans`` is true only while the ban lasts."""

    def __init__(self, ban_s: float, capacity: int = 4096) -> None:
        self.ban_s = ban_s
        self.capacity = capacity
        self._until: dict[str, float] = {}

    def add(self, peer: str) -> None:
        self._until[peer] = time.monotonic() + self.ban_s
        if len(self._until) > self.capacity:
            del self._until[min(self._until, key=self._until.__getitem__)]

    def __contains__(self, peer: object) -> bool:
        until = self._until.get(peer)  # type: ignore[call-overload]
        return until is not None and until > time.monotonic()

    def __len__(self) -> int:
        now = time.monotonic()
        return sum(1 for t in self._until.values() if t > now)

    def expired(self) -> list[str]:
        """Remove and return the peers whose ban has run out."""
        now = time.monotonic()
        out = [p for p, t in self._until.items() if t <= now]
        for p in out:
            del self._until[p]
        return out
