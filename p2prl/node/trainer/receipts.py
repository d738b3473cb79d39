"""The trainer's receipts: which announced batches it received, listed in a signed ``Receipts``
every ``RECEIPTS_S`` seconds, and which chained batch each receipt may seed (docs/PROTOCOL.md §14).

A receipt seeds one batch: the next batch of the key that announced the receipted one. Only such
chained batches are trained, and only when the batch they follow was accepted, so a key cannot pick
its prompts: withholding a batch it did not like costs it a chain start (a batch of work nobody
trains) before it is trained again. Receipts are bounded per list, and keys with accepted work keep
half of each list for themselves (keys are free: a flood of new ones must not stall honest chains).
"""

from __future__ import annotations

import hashlib
import os
import threading

from p2prl.crypto import Identity
from p2prl.lru import LRU
from p2prl.node.trainer.chainlog import ChainLog
from p2prl.protocol import Receipts, RolloutAnnouncement, encode_message, receipt_id
from p2prl.reasons import NodeDrop

RECEIPTS_S = 1.0  # how often the pending receipts are listed and sent
PER_SIGNER = 64  # receipts of one key in one list
KEPT = 1 << 16  # receipts sent, remembered until their chained batch arrives
RESENT = 4  # the newest lists, sent again while none is new (gossip is lossy)


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

    def take(self) -> bytes | None:
        """The signed ``Receipts`` of everything pending (None: nothing is), recorded as sent."""
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
        self.chainlog.sent((s, b, digest) for s, b in pending.values())
        return raw

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
