"""A file of JSON lines appended as a piece of state changes and replayed at start, rewritten from
its owner's state once it has doubled: how a node keeps small, often-changing state across restarts
without writing all of it at each change.

Each append is in the kernel before the caller goes on (a process crash keeps it); a torn last line
(a crash mid-write) is skipped at replay; a failed write is logged, never raised (a full disk costs
what a restart would have kept, not the running node)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from p2prl.atomicfile import write_atomic

log = logging.getLogger(__name__)

Record = dict[str, Any]


class AppendLog:
    """``append`` from any thread; ``rewrite`` when ``due``. ``path`` None keeps nothing."""

    def __init__(self, path: Path | None, min_lines: int = 4096) -> None:
        self.path = path
        self.min_lines = min_lines  # lines appended before a rewrite is worth it
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._lines = 0  # appended since the last rewrite
        self._kept = 0  # lines the last rewrite wrote

    def replay(self) -> Iterator[Record]:
        """Every whole record, oldest first (nothing when there is no file)."""
        if self.path is None or not self.path.exists():
            return
        with self.path.open("r", encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield rec

    def append(self, recs: Iterable[Record]) -> None:
        if self.path is None:
            return
        lines = [json.dumps(r, separators=(",", ":")) + "\n" for r in recs]
        if not lines:
            return
        with self._lock:
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    self._file = os.fdopen(fd, "a", encoding="utf-8")
                self._file.write("".join(lines))
                self._file.flush()
            except OSError as e:
                log.warning("%s not kept: %s", self.path.name, e)
                return
            self._lines += len(lines)

    def due(self) -> bool:
        """Whether the file has grown past twice what its last rewrite wrote."""
        with self._lock:
            return self.path is not None and self._lines > max(self.min_lines, self._kept)

    def rewrite(self, snapshot: Callable[[], Iterable[Record]]) -> None:
        """Replace the file by ``snapshot()``'s records: the owner's state, read under this log's
        lock, so no append falls between the snapshot and the new file."""
        if self.path is None:
            return
        with self._lock:
            lines = [json.dumps(r, separators=(",", ":")) + "\n" for r in snapshot()]
            self._close()
            try:
                write_atomic(self.path, "".join(lines).encode())
            except OSError as e:
                log.warning("%s not rewritten: %s", self.path.name, e)
                return
            self._kept, self._lines = len(lines), 0

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
