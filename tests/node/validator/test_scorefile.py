"""A validator's scores kept across a restart: written whole, taken back, an unreadable file ignored."""

from __future__ import annotations

from pathlib import Path

from p2prl.node.validator.scorefile import load_scores, save_scores
from p2prl.proof import ScoreBook

A = "aa" * 32


def test_scores_are_taken_back_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "scores.json"
    book = ScoreBook(window=8)
    book.record(A, 3, 12)
    save_scores(path, book)
    assert path.stat().st_mode & 0o777 == 0o600
    again = load_scores(path, ScoreBook(window=8))
    assert again.scores() == {A: 12} and again.latest == 3


def test_a_missing_or_unreadable_file_starts_from_none(tmp_path: Path, caplog) -> None:
    assert load_scores(tmp_path / "none.json", ScoreBook(window=8)).scores() == {}
    bad = tmp_path / "scores.json"
    bad.write_text('{"latest": 3, "miners": [')  # a torn file
    assert load_scores(bad, ScoreBook(window=8)).scores() == {}
    assert "unusable" in caplog.text
