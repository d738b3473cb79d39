"""The trainer's receipts: which announced batches it received, listed in a signed ``Receipts``
every ``RECEIPTS_S`` seconds, and which chained batch each receipt may seed (docs/PROTOCOL.md §14).

A receipt seeds one batch: the next batch of the key that announced the receipted one. Only such
chained batches are trained, and only when the batch they follow was accepted, so a key cannot pick
its prompts: withholding a batch it did not like costs it a chain start (a batch of work nobody
trains) before it is trained again. Receipts are bounded per list, and keys with accepted work keep
half of each list for themselves (keys are free: a flood of new ones must not stall honest chains).

Gossip is lossy and miners restart, so a list is sent again ``RESEND_AFTER_S`` after it first went
out, each time only while one of its receipts is still unused: a lost list, or one sent while its
miner was down for up to five minutes, still reaches it, and a list whose receipts all seeded their
batches is never sent again.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

from p2prl.crypto import Identity
from p2prl.lru import LRU
from p2prl.node.trainer.chainlog import ChainLog
from p2prl.protocol import Receipts, RolloutAnnouncement, encode_message, receipt_id
from p2prl.reasons import NodeDrop

RECEIPTS_S = 1.0  # how often the pending receipts are listed and sent
PER_SIGNER = 64  # receipts of one key in one list
KEPT = 1 << 16  # receipts sent, remembered until their chained batch arrives
RESENT = 4  # the newest lists, kept in ``recent`` (only tests read it; the re-sends use the history)
RESEND_AFTER_S = (5.0, 30.0, 120.0, 300.0)  # a list sent again this long after it first went out
HISTORY_BYTES = 16 << 20  # lists kept for sending again (the oldest go first past this)


@dataclass
class _Sent:
    """A list sent, for sending again while a receipt in it is unused."""

    at: float  # when it first went out (monotonic)
    digest: str
    raw: bytes
    keys: tuple[tuple[str, str], ...]  # (signer hex, blob id) of its receipts
    resends: int = 0  # how many of RESEND_AFTER_S have passed


class ReceiptBook:
    """Pending receipts (pump thread adds), the lists made of them (receipts loop takes), and the
    receipts sent, each good for one chained batch (fetch threads ask)."""

    def __init__(
        self,
        identity: Identity,
        network: str,
        max_entries: int = Receipts.MAX_ENTRIES,
        chainlog: ChainLog | None = None,
    ) -> None:
        self.identity = identity
        self.network = network
        self.max_entries = max_entries
        self.chainlog = chainlog or ChainLog(None)  # the receipts sent and used, kept across restarts
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, str]] = {}  # receipt id -> signer hex, blob id
        self._per_signer: dict[str, int] = {}
        self._untrusted = 0  # pending receipts of keys without an accepted batch
        # (signer hex, blob id) -> digest of the list that receipted it, until a batch used it
        self._sent: LRU[tuple[str, str], str] = LRU(KEPT)
        self.recent: list[bytes] = []  # the newest envelopes sent
        self._history: deque[_Sent] = deque()  # lists to send again, oldest first
        self._history_bytes = 0

    def add(self, signer: bytes, blob_id: str, trusted: bool) -> NodeDrop | None:
        """Receipt an announcement when the next list comes; a reason code when it does not fit."""
        rid, signer_hex = receipt_id(signer, blob_id), signer.hex()
        with self._lock:
            if rid in self._pending:
                return None
            if self._per_signer.get(signer_hex, 0) >= PER_SIGNER:
                return NodeDrop.RECEIPTS_FULL
            if len(self._pending) >= self.max_entries or (not trusted and self._untrusted >= self.max_entries // 2):
                return NodeDrop.RECEIPTS_FULL
            self._pending[rid] = (signer_hex, blob_id)
            self._per_signer[signer_hex] = self._per_signer.get(signer_hex, 0) + 1
            self._untrusted += not trusted
        return None

    def take(self, now: float | None = None) -> bytes | None:
        """The signed ``Receipts`` of everything pending (None: nothing is), recorded as sent at
        ``now`` (monotonic; default: the clock)."""
        with self._lock:
            if not self._pending:
                return None
            pending, self._pending, self._per_signer, self._untrusted = self._pending, {}, {}, 0
        msg = Receipts(entries=tuple(sorted(pending)), nonce=os.urandom(16).hex())
        raw = encode_message(self.identity, self.network, msg)
        digest = hashlib.sha256(raw).hexdigest()
        with self._lock:
            for key in pending.values():
                self._sent[key] = digest
            self.recent = [*self.recent, raw][-RESENT:]
            self._history.append(_Sent(time.monotonic() if now is None else now, digest, raw, tuple(pending.values())))
            self._history_bytes += len(raw)
            while self._history_bytes > HISTORY_BYTES:
                self._history_bytes -= len(self._history.popleft().raw)
        self.chainlog.sent((s, b, digest) for s, b in pending.values())
        return raw

    def due(self, now: float | None = None) -> list[bytes]:
        """The lists to send again now: each one whose next delay in ``RESEND_AFTER_S`` has passed
        and that still holds a receipt no batch used (the others are forgotten)."""
        now = time.monotonic() if now is None else now
        out: list[bytes] = []
        with self._lock:
            kept: deque[_Sent] = deque()
            for item in self._history:
                if not any(self._sent.get(k) == item.digest for k in item.keys):
                    self._history_bytes -= len(item.raw)
                    continue  # every receipt in it seeded its batch (or was forgotten)
                passed = sum(now - item.at >= d for d in RESEND_AFTER_S)
                if passed > item.resends:
                    item.resends = passed
                    out.append(item.raw)
                if item.resends < len(RESEND_AFTER_S):
                    kept.append(item)
                else:
                    self._history_bytes -= len(item.raw)
            self._history = kept
        return out

    def restore(self, sent: LRU[tuple[str, str], str]) -> None:
        """The receipts a restarted trainer sent before and no batch used (``chainlog``)."""
        with self._lock:
            for key, digest in sent.items():
                self._sent[key] = digest

    def sent(self) -> LRU[tuple[str, str], str]:
        """A copy of the receipts sent and not used, oldest first."""
        with self._lock:
            return self._sent.copy()

    def seeds(self, signer_hex: str, ann: RolloutAnnouncement) -> bool:
        """Whether ``ann`` (announced by ``signer_hex``) is the one chained batch its receipt seeds:
        this trainer receipted its previous batch in the list it names, and no batch used it before.
        Uses the receipt up."""
        if not ann.chained:
            return False
        key = (signer_hex, ann.prev)
        with self._lock:
            if self._sent.get(key) != ann.receipts:
                return False
            del self._sent[key]
        self.chainlog.used(*key)  # kept before the batch is trained: never two batches on one receipt
        return True
