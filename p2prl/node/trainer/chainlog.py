"""The trainer's record of its receipt chains, kept across restarts (docs/PROTOCOL.md §14): the
receipts it sent, the ones a batch used up, which batches it released for training or vetoed, and
the keys it barred.

Without it a restarted trainer trains no miner's next batch (the receipt that seeds it and the
decision on the batch it follows are forgotten): every honest miner would pay a batch of work for
the trainer's restart, and a barred key would be trusted again. An ``AppendLog`` replayed at start:
a receipt's use is written before its batch is trained, so a crash never trains two batches on one
receipt. The owners of the state (the ``ReceiptBook``, the admission ``Intake``, the intake's bars)
write to it, and it is rewritten from their state when it has doubled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from p2prl.appendlog import AppendLog, Record
from p2prl.lru import LRU
from p2prl.protocol import is_hex

log = logging.getLogger(__name__)

Sent = tuple[str, str, str]  # (signer hex, blob id, digest of the list that receipted it)


@dataclass
class ChainState:
    """What a restarted trainer takes back, oldest first, bounded as its owners bound it."""

    sent: LRU[tuple[str, str], str]
    decided: LRU[tuple[str, str], bool]  # True: vetoed
    barred: LRU[str, int]  # miner key -> the last version it is barred for

    def apply(self, rec: Record) -> None:
        kind = rec.get("k")
        if kind == "bar":
            miner, until = rec.get("m"), rec.get("u")
            if is_hex(miner) and type(until) is int:
                self.barred.put(miner, max(until, self.barred.get(miner, until)))
            return
        signer, blob = rec.get("s"), rec.get("b")
        if not (is_hex(signer) and is_hex(blob)):
            return
        key = (signer, blob)
        if kind == "sent" and is_hex(rec.get("d")):
            self.sent.put(key, rec["d"])
        elif kind == "used":
            self.sent.pop(key, None)
        elif kind in ("ok", "veto"):
            self.decided.put(key, kind == "veto" or self.decided.get(key, False))

    def records(self) -> Iterator[Record]:
        for (s, b), d in list(self.sent.items()):
            yield {"k": "sent", "s": s, "b": b, "d": d}
        for (s, b), v in list(self.decided.items()):
            yield _decided(s, b, v)
        for m, u in list(self.barred.items()):
            yield {"k": "bar", "m": m, "u": u}


def _decided(signer: str, blob: str, vetoed: bool) -> Record:
    return {"k": "veto" if vetoed else "ok", "s": signer, "b": blob}


class ChainLog:
    """Writes from any thread; ``compact`` from the receipts thread when ``due``."""

    def __init__(self, path: Path | None, min_lines: int = 4096) -> None:
        self.file = AppendLog(path, min_lines)

    def load(self, state: ChainState) -> ChainState:
        """Replay the file into ``state`` (no file: it stays empty), then rewrite it compacted."""
        n = 0
        for rec in self.file.replay():
            state.apply(rec)
            n += 1
        if n:
            log.info("receipt chains: %d receipts unused, %d decisions, %d keys barred (%d records)",
                     len(state.sent), len(state.decided), len(state.barred), n)
            self.file.rewrite(state.records)
        return state

    def sent(self, entries: Iterable[Sent]) -> None:
        self.file.append({"k": "sent", "s": s, "b": b, "d": d} for s, b, d in entries)

    def used(self, signer: str, blob: str) -> None:
        self.file.append([{"k": "used", "s": signer, "b": blob}])

    def decided(self, signer: str, blob: str, vetoed: bool) -> None:
        self.file.append([_decided(signer, blob, vetoed)])

    def barred(self, miner: str, until: int) -> None:
        self.file.append([{"k": "bar", "m": miner, "u": until}])

    def due(self) -> bool:
        return self.file.due()

    def compact(self, snapshot: Callable[[], ChainState]) -> None:
        """Rewrite the file from the owners' state (``snapshot``, read under the file's lock)."""
        self.file.rewrite(lambda: snapshot().records())

    def close(self) -> None:
        self.file.close()
