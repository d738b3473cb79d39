"""An on-disk journal of the signed messages a node received and sent, so an operator or an auditor
can replay a validator's decisions after the fact (``p2prl verify-batch`` reads announcements from it).

Only the messages that decide standing are kept: rollout announcements, verdicts and scores, each as
its whole signed envelope (anyone can verify it again; nothing in a record is trusted on its own). The
journal is a directory of JSON-lines segments, one record a line::

    {"ms": 1767225600000, "dir": "in", "type": "verdict", "sha256": "…", "blob_id": "…", "envelope": "…"}

``blob_id`` is the announced or judged blob's id (absent for scores). A segment is closed at
``max_bytes / 8`` and the oldest segments are deleted while the journal holds more than ``max_bytes``,
so a flood of gossip costs at most that much disk. Writing is best effort: a full disk is logged and
counted, never raised into the pump.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from p2prl.protocol import Receipts, RolloutAnnouncement, Scores, Verdict

log = logging.getLogger(__name__)

JOURNALED = frozenset({RolloutAnnouncement.TYPE, Receipts.TYPE, Verdict.TYPE, Scores.TYPE})
SEGMENT_GLOB = "journal-*.jsonl"
JOURNAL_DIR = "journal"


def envelope_type(raw: bytes) -> str:
    """The type an envelope names (§2 layout), or "" for bytes too short to say."""
    if len(raw) < 5:
        return ""
    tlen = raw[4]
    return raw[5 : 5 + tlen].decode("ascii", "replace")


class Journal:
    """Append-only, size-bounded record of signed envelopes in ``directory``."""

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        if max_bytes < 1 << 16:
            raise ValueError("a journal needs at least 64 KiB")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = max(max_bytes // 8, 1 << 13)
        self._lock = threading.Lock()
        self.failures = 0
        segs = self.segments()
        self._seq = int(segs[-1].stem.split("-")[1]) if segs else 0
        self._size = segs[-1].stat().st_size if segs else self.segment_bytes  # start a fresh one

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return sorted(self.dir.glob(SEGMENT_GLOB))

    def record(self, direction: str, raw: bytes, blob_id: str = "") -> None:
        """Append one envelope (``direction`` "in" or "out") if its type is journaled."""
        typ = envelope_type(raw)
        if typ not in JOURNALED:
            return
        rec: dict[str, Any] = {
            "ms": int(time.time() * 1000),
            "dir": direction,
            "type": typ,
            "sha256": hashlib.sha256(raw).hexdigest(),
            "envelope": raw.hex(),
        }
        if blob_id:
            rec["blob_id"] = blob_id
        line = (json.dumps(rec, sort_keys=True) + "\n").encode()
        with self._lock:
            try:
                if self._size + len(line) > self.segment_bytes:
                    self._seq += 1
                    self._size = 0
                    self._prune(len(line))
                with open(self.dir / f"journal-{self._seq:08d}.jsonl", "ab") as f:
                    f.write(line)
                self._size += len(line)
            except OSError as e:
                self.failures += 1
                log.warning("journal write failed: %s", e)

    def _prune(self, incoming: int) -> None:
        segs = self.segments()
        total = sum(p.stat().st_size for p in segs) + incoming
        for p in segs:
            if total <= self.max_bytes:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)


def read_journal(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every record, oldest first (a torn last line of a crashed write is skipped)."""
    for seg in sorted(Path(directory).glob(SEGMENT_GLOB)):
        for line in seg.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("envelope"), str):
                yield rec


def find_envelopes(directory: str | Path, blob_id: str, typ: str) -> list[bytes]:
    """The journaled envelopes of type ``typ`` about ``blob_id``, oldest first (unverified bytes)."""
    return [
        bytes.fromhex(r["envelope"])
        for r in read_journal(directory)
        if r.get("type") == typ and r.get("blob_id") == blob_id
    ]


def find_by_digest(directory: str | Path, typ: str, digest: str) -> bytes | None:
    """The journaled envelope of type ``typ`` whose SHA-256 is ``digest`` (a trainer's receipts list a
    chained batch names), or None (unverified bytes)."""
    for r in read_journal(directory):
        if r.get("type") == typ:
            raw = bytes.fromhex(r["envelope"])
            if hashlib.sha256(raw).hexdigest() == digest:
                return raw
    return None


class JournaledPort:
    """A node's network port that journals the standing messages passing through it (a wrapper:
    every other attribute is the wrapped port's)."""

    def __init__(self, net: Any, journal: Journal) -> None:
        self._net = net
        self.journal = journal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)

    def poll(self, timeout: float = 0.0) -> list[Any]:
        items = self._net.poll(timeout)
        for item in items:
            env = item.envelope
            if env.type in JOURNALED:
                self.journal.record("in", env.raw, _blob_id(item.message))
        return items

    def publish(self, topic: str, envelope: bytes) -> None:
        self._net.publish(topic, envelope)
        if envelope_type(envelope) in JOURNALED:
            self.journal.record("out", envelope, _blob_id_of_raw(envelope))


def _blob_id(msg: Any) -> str:
    if isinstance(msg, RolloutAnnouncement):
        return msg.blob.id
    if isinstance(msg, Verdict):
        return msg.blob_id
    return ""


def _blob_id_of_raw(raw: bytes) -> str:
    """The blob id an outgoing envelope names (our own bytes: parsed without verifying again)."""
    try:
        tlen = raw[4]
        blen = int.from_bytes(raw[37 + tlen : 41 + tlen], "big")
        body = json.loads(raw[41 + tlen : 41 + tlen + blen])
    except (IndexError, ValueError):
        return ""
    if isinstance(body, dict):
        blob = body.get("blob")
        if isinstance(blob, dict) and isinstance(blob.get("id"), str):
            return blob["id"]
        if isinstance(body.get("blob_id"), str):
            return body["blob_id"]
    return ""


def journaled(net: Any, data_dir: Path, max_bytes: int) -> Any:
    """``net`` with its standing messages journaled under ``data_dir/journal`` (the node's hook)."""
    return JournaledPort(net, Journal(Path(data_dir) / JOURNAL_DIR, max_bytes))
