"""Replay and staleness guard for envelopes received from peers.

Every body carries ``created_ms``; an envelope is accepted once, only inside a time window. A digest
is remembered until its envelope leaves that window (``created_ms`` older than ``max_age_s``), when a
replay is refused as stale anyway, so a replay is recognised for as long as it could be accepted.
The memory is bounded (``capacity``): when it is full the entry created earliest goes and the guard
raises its *watermark* to that ``created_ms``; from then on an envelope created at or before the
watermark is refused as stale, because the guard can no longer tell whether it was seen. A flood
therefore shortens the window (to what ``capacity`` envelopes span), never reopens it to a replay;
messages on their way from their signer arrive within seconds and pass.
"""

from __future__ import annotations

import heapq
import time

from p2prl.crypto.envelope import Envelope, EnvelopeError
from p2prl.reasons import InputReason


class ReplayGuard:
    def __init__(self, *, max_age_s: float = 600.0, max_skew_s: float = 60.0, capacity: int = 65536) -> None:
        self.max_age_ms = int(max_age_s * 1000)
        self.max_skew_ms = int(max_skew_s * 1000)
        self.capacity = capacity
        self.watermark = -1  # created_ms at or below which nothing is accepted (memory overflowed)
        self._seen: dict[bytes, int] = {}
        self._expiry: list[tuple[int, bytes]] = []  # (created_ms, digest), a min-heap

    def __len__(self) -> int:
        return len(self._seen)

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
            raise EnvelopeError(InputReason.REPLAYED, d.hex()[:16])
        if created <= self.watermark:
            raise EnvelopeError(InputReason.STALE, "older than the replay memory reaches")
        self._expire(now)
        self._seen[d] = created
        heapq.heappush(self._expiry, (created, d))
        while len(self._seen) > self.capacity:
            first, gone = heapq.heappop(self._expiry)
            del self._seen[gone]
            self.watermark = max(self.watermark, first)

    def _expire(self, now: int) -> None:
        """Forget digests whose envelopes are past ``max_age_s``: the age check refuses them now."""
        while self._expiry and self._expiry[0][0] < now - self.max_age_ms:
            _, gone = heapq.heappop(self._expiry)
            del self._seen[gone]
