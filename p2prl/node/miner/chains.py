"""A miner's receipt chains (docs/PROTOCOL.md §14): its announced batches waiting for the trainer's
receipt, and the receipts its next batches follow, oldest first.

A batch that follows a receipt is seeded by ``chain_seed(receipts digest, previous blob id)`` and
trained; with no receipt in hand the miner makes a chain start (seeded by the version, trained by
nobody) rather than wait, so a miner runs as many chains as the trainer's receipt latency needs.

Both are kept in the miner's directory (``chains.json``), so a restarted miner goes on with the
receipts it held instead of making a chain start for each: a slot is written away before a batch
uses it, so a crash never makes two batches on one receipt.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from p2prl.atomicfile import write_atomic
from p2prl.net import Incoming
from p2prl.protocol import Receipts, is_hex, receipt_id

log = logging.getLogger(__name__)

WAITING = 256  # announced batches waiting for a receipt
SLOTS = 256  # receipts in hand
SLOT_MAX_AGE_S = 600.0  # a receipt older than this seeds nothing (validators keep lists about this long)

Slot = tuple[str, str]  # (previous blob id, receipts digest)

class Chains:
    """Pump thread: ``on_receipts``; generation loop: ``take``, ``give_back``, ``announced``.
    ``path``: where they are kept across restarts (None: in memory only)."""

    def __init__(self, key: bytes, path: Path | None = None) -> None:
        self.key = bytes(key)
        self.path = path
        self._lock = threading.Lock()
        self._waiting: OrderedDict[str, str] = OrderedDict()  # receipt id -> blob id
        self._slots: deque[tuple[float, Slot]] = deque(maxlen=SLOTS)  # (wall-clock time, slot)
        self._load()

    def announced(self, blob_id: str) -> None:
        with self._lock:
            self._waiting[receipt_id(self.key, blob_id)] = blob_id
            while len(self._waiting) > WAITING:
                self._waiting.popitem(last=False)
            self._save()

    def on_receipts(self, item: Incoming[Receipts]) -> None:
        digest = item.envelope.digest.hex()
        with self._lock:
            found = False
            for e in item.message.entries:
                blob_id = self._waiting.pop(e, None)
                if blob_id is not None:
                    self._slots.append((time.time(), (blob_id, digest)))
                    found = True
            if found:
                self._save()

    def take(self) -> Slot | None:
        """The oldest receipt still young enough to seed a batch (None: make a chain start), written
        away before it is returned."""
        now = time.time()
        with self._lock:
            stale = False
            while self._slots:
                at, slot = self._slots.popleft()
                if now - at <= SLOT_MAX_AGE_S:
                    self._save()
                    return slot
                stale = True
            if stale:
                self._save()
        return None

    def give_back(self, slot: Slot) -> None:
        """A slot taken for a batch that was not announced."""
        with self._lock:
            self._slots.appendleft((time.time(), slot))
            self._save()

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    # -- kept across restarts ----------------------------------------------------
    def _save(self) -> None:
        if self.path is None:
            return
        state = {"waiting": list(self._waiting.items()), "slots": [[at, b, d] for at, (b, d) in self._slots]}
        try:
            write_atomic(self.path, json.dumps(state).encode())
        except OSError as e:  # a full disk costs chain starts after a restart, not the batch
            log.warning("chains not kept: %s", e)

    def _load(self) -> None:
        """What a previous run kept; anything malformed is left out (the file is the node's own, but a
        half-written disk must not stop a miner)."""
        if self.path is None:
            return
        try:
            state = json.loads(self.path.read_text())
            waiting, slots = state["waiting"], state["slots"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not isinstance(waiting, list) or not isinstance(slots, list):
            return
        for e in waiting[-WAITING:]:
            if isinstance(e, list) and len(e) == 2 and is_hex(e[0], 16) and is_hex(e[1], 32):
                self._waiting[e[0]] = e[1]
        now = time.time()
        for e in slots[-SLOTS:]:
            if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], int | float)):
                continue
            if is_hex(e[1], 32) and is_hex(e[2], 32) and 0 <= now - float(e[0]) <= SLOT_MAX_AGE_S:
                self._slots.append((float(e[0]), (e[1], e[2])))
