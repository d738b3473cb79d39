"""A validator's scores kept across restarts (``scores.json`` in its directory), so a restart
neither zeroes every honest miner's score until the window refills nor clears a cheater's hard
failure from it; and beside them each key's record of sides (``sides.json``, ``proof.sides``), so a
restart does not clear a steering key's run of wins. Written whole (atomically) each time the scores
are gossiped: a few KiB per thousand miners."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2prl.atomicfile import write_atomic
from p2prl.proof import ScoreBook, SideRecord

log = logging.getLogger(__name__)

SCORES_FILE = "scores.json"
SIDES_FILE = "sides.json"


def _load(path: Path, restore: Callable[[Any], int], what: str) -> int:
    """Hand what is kept at ``path`` to ``restore`` (none, or an unreadable file: nothing)."""
    if not path.exists():
        return 0
    try:
        return restore(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        log.warning("kept %s %s unusable (%s): starting from none", what, path, e)
        return 0


def _save(path: Path, state: Any, what: str) -> None:
    try:
        write_atomic(path, json.dumps(state, separators=(",", ":")).encode())
    except OSError as e:  # a full disk costs what a restart takes back, not the running validator
        log.warning("%s not kept: %s", what, e)


def load_scores(path: Path, book: ScoreBook) -> ScoreBook:
    """``book`` with the scores kept at ``path`` taken back (none, or an unreadable file: as it was)."""
    n = _load(path, book.restore, "scores")
    if n:
        log.info("scores of %d miners taken back (window %d, up to v%d)", n, book.window, book.latest)
    return book


def save_scores(path: Path, book: ScoreBook) -> None:
    _save(path, book.state(), "scores")


def load_sides(path: Path, record: SideRecord) -> None:
    """``record`` with the sides kept at ``path`` taken back."""
    n = _load(path, record.restore, "sides")
    if n:
        log.info("sides of %d keys taken back", n)


def save_sides(path: Path, record: SideRecord) -> None:
    _save(path, record.state(), "sides")
