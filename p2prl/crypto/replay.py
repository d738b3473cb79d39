"""Replay and staleness guard for envelopes received from peers.

Every body carries ``created_ms``; an envelope is accepted once, only inside a time window, and the
memory of what was seen is bounded (an LRU of digests), so a peer cannot make us hold more.
"""

from __future__ import annotations

import time

from p2prl.crypto.envelope import Envelope, EnvelopeError
from p2prl.lru import LRU
from p2prl.reasons import InputReason


class ReplayGuard:
    def __init__(self, *, max_age_s: float = 600.0, max_skew_s: float = 60.0, capacity: int = 65536) -> None:
        self.max_age_ms = int(max_age_s * 1000)
        self.max_skew_ms = int(max_skew_s * 1000)
        self.capacity = capacity
        self._seen: LRU[bytes, int] = LRU(capacity)

    def check(self, env: Envelope, *, now_ms: int | None = None) -> None:
        """Raise EnvelopeError('replayed'|'stale'|'future'|'bad_body') or record the envelope as seen."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        created = env.body.get("created_ms")
        if not isinstance(created, int) or isinstance(created, bool):
            raise EnvelopeError(InputReason.BAD_BODY, "created_ms missing")
        if created < now - self.max_age_ms:
            raise EnvelopeError(InputReason.STALE, f"created {now - created} ms ago")
        if created > now + self.max_skew_ms:
            raise EnvelopeError(InputReason.FUTURE, f"created {created - now} ms ahead")
        d = env.digest
        if d in self._seen:
            self._seen.touch(d)
            raise EnvelopeError(InputReason.REPLAYED, d.hex()[:16])
        self._seen[d] = created
