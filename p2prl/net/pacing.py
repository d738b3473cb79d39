"""An upload cap: a byte token bucket that serving streams reserve from before they send a chunk.

Volunteers share their uplink with everything else at home; a node that serves chunks as fast as
TCP allows can saturate it. Reservations may run the bucket into debt: each sender waits until its
bytes are covered, so concurrent streams share the rate in arrival order without a lock. A wait
longer than ``max_wait_s`` is refused (the caller answers BUSY and the downloader asks another peer)
instead of holding a requester until its timeout.
"""

from __future__ import annotations

import time


class UploadPacer:
    def __init__(self, bytes_per_s: float, burst_bytes: float | None = None, max_wait_s: float = 2.0) -> None:
        if bytes_per_s <= 0:
            raise ValueError("the upload rate must be positive")
        self.rate = float(bytes_per_s)
        self.burst = float(burst_bytes) if burst_bytes is not None else self.rate * 0.1
        self.max_wait_s = max_wait_s
        self.tokens = self.burst
        self.last = time.monotonic()

    def reserve(self, n: int, now: float | None = None) -> float | None:
        """Seconds to wait before sending ``n`` bytes, or None (nothing reserved) if that is too long."""
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        wait = max(0.0, (n - self.tokens) / self.rate)
        if wait > self.max_wait_s:
            return None
        self.tokens -= n
        return wait
