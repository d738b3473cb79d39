"""A miner's receipt chains (docs/PROTOCOL.md §14): its announced batches waiting for the trainer's
receipt, and the receipts its next batches follow, oldest first.

A batch that follows a receipt is seeded by ``chain_seed(receipts digest, previous blob id)`` and
trained; with no receipt in hand the miner makes a chain start (seeded by the version, trained by
nobody) rather than wait, so a miner runs as many chains as the trainer's receipt latency needs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque

from p2prl.net import Incoming
from p2prl.protocol import Receipts, receipt_id

WAITING = 256  # announced batches waiting for a receipt
SLOTS = 256  # receipts in hand
SLOT_MAX_AGE_S = 600.0  # a receipt older than this seeds nothing (validators keep lists about this long)

Slot = tuple[str, str]  # (previous blob id, receipts digest)


class Chains:
    """Pump thread: ``on_receipts``; generation loop: ``take``, ``give_back``, ``announced``."""

    def __init__(self, key: bytes) -> None:
        self.key = bytes(key)
        self._lock = threading.Lock()
        self._waiting: OrderedDict[str, str] = OrderedDict()  # receipt id -> blob id
        self._slots: deque[tuple[float, Slot]] = deque(maxlen=SLOTS)

    def announced(self, blob_id: str) -> None:
        with self._lock:
            self._waiting[receipt_id(self.key, blob_id)] = blob_id
            while len(self._waiting) > WAITING:
                self._waiting.popitem(last=False)

    def on_receipts(self, item: Incoming[Receipts]) -> None:
        digest = item.envelope.digest.hex()
        with self._lock:
            for e in item.message.entries:
                blob_id = self._waiting.pop(e, None)
                if blob_id is not None:
                    self._slots.append((time.monotonic(), (blob_id, digest)))

    def take(self) -> Slot | None:
        """The oldest receipt still young enough to seed a batch (None: make a chain start)."""
        now = time.monotonic()
        with self._lock:
            while self._slots:
                at, slot = self._slots.popleft()
                if now - at <= SLOT_MAX_AGE_S:
                    return slot
        return None

    def give_back(self, slot: Slot) -> None:
        """A slot taken for a batch that was not announced."""
        with self._lock:
            self._slots.appendleft((time.monotonic(), slot))

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)
