"""A validator's scores kept across restarts (``scores.json`` in its directory), so a restart
neither zeroes every honest miner's score until the window refills nor clears a cheater's hard
failure from it. Written whole (atomically) each time the scores are gossiped: a few KiB per
thousand miners."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from p2prl.atomicfile import write_atomic
from p2prl.proof import ScoreBook

log = logging.getLogger(__name__)

SCORES_FILE = "scores.json"


def load_scores(path: Path, book: ScoreBook) -> ScoreBook:
    """``book`` with the scores kept at ``path`` taken back (none, or an unreadable file: as it was)."""
    if not path.exists():
        return book
    try:
        n = book.restore(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        log.warning("kept scores %s unusable (%s): starting from none", path, e)
        return book
    log.info("scores of %d miners taken back (window %d, up to v%d)", n, book.window, book.latest)
    return book


def save_scores(path: Path, book: ScoreBook) -> None:
    try:
        write_atomic(path, json.dumps(book.state(), separators=(",", ":")).encode())
    except OSError as e:  # a full disk costs the scores after a restart, not the running validator
        log.warning("scores not kept: %s", e)
