"""The trainer's ``Receipts`` lists a validator has seen, by envelope digest: what a chained batch's
seed is read from (docs/PROTOCOL.md §14). Bounded: a list older than the staleness window seeds no
batch a validator still judges."""

from __future__ import annotations

import threading

from p2prl.lru import LRU
from p2prl.net import Incoming
from p2prl.protocol import Receipts

KEPT = 1024  # lists remembered (one a second: about seventeen minutes)


class ReceiptLists:
    """Pump thread adds (``on_receipts``), the judging thread reads (``entries``)."""

    def __init__(self, kept: int = KEPT) -> None:
        self._lock = threading.Lock()
        self._lists: LRU[str, frozenset[str]] = LRU(kept)

    def on_receipts(self, item: Incoming[Receipts]) -> None:
        with self._lock:
            self._lists[item.envelope.digest.hex()] = frozenset(item.message.entries)

    def entries(self, digest: str) -> frozenset[str] | None:
        with self._lock:
            return self._lists.get(digest)
