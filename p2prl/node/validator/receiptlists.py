"""The trainer's ``Receipts`` lists a validator has seen, by envelope digest: what a chained batch's
seed is read from (docs/PROTOCOL.md §14). Bounded: a list older than the staleness window seeds no
batch a validator still judges.

Kept in the validator's directory (``receipts.jsonl``, an ``AppendLog``), so a restarted validator
still judges the chained batches of lists it saw before: the trainer sends a list again for at most
five minutes, so a list lost with a restart would leave every miner's batch on it unjudged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from p2prl.appendlog import AppendLog, Record
from p2prl.lru import LRU
from p2prl.net import Incoming
from p2prl.protocol import Receipts, is_hex

KEPT = 1024  # lists remembered (one a second: about seventeen minutes)
RECEIPTS_FILE = "receipts.jsonl"


class ReceiptLists:
    """Pump thread adds (``on_receipts``), the judging thread reads (``entries``); ``path``: where
    they are kept across restarts (None: in memory only)."""

    def __init__(self, kept: int = KEPT, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._lists: LRU[str, frozenset[str]] = LRU(kept)
        self._file = AppendLog(path, min_lines=kept)
        for rec in self._file.replay():
            digest, entries = rec.get("d"), rec.get("e")
            if (
                is_hex(digest)
                and isinstance(entries, list)
                and len(entries) <= Receipts.MAX_ENTRIES
                and all(is_hex(e) for e in entries)
            ):
                self._lists.put(digest, frozenset(entries))
        if len(self._lists):
            self._file.rewrite(self._records)

    def on_receipts(self, item: Incoming[Receipts]) -> None:
        digest = item.envelope.digest.hex()
        with self._lock:
            if digest in self._lists:  # the trainer sends a list again while a receipt in it is unused
                return
            self._lists[digest] = frozenset(item.message.entries)
        self._file.append([{"d": digest, "e": sorted(item.message.entries)}])
        if self._file.due():
            self._file.rewrite(self._records)

    def entries(self, digest: str) -> frozenset[str] | None:
        with self._lock:
            return self._lists.get(digest)

    def close(self) -> None:
        self._file.close()

    def _records(self) -> Iterator[Record]:
        with self._lock:
            lists = list(self._lists.items())
        for digest, entries in lists:
            yield {"d": digest, "e": sorted(entries)}
