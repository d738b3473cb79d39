"""A validator's scores and keys' sides kept across a restart: written whole, taken back, an
unreadable file or entry ignored."""

from __future__ import annotations

import math
from pathlib import Path

from p2prl.node.validator.scorefile import load_scores, load_sides, save_scores, save_sides
from p2prl.proof import ScoreBook
from p2prl.proof.sides import SideRecord

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


def test_a_steering_keys_record_of_sides_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sides.json"
    rec = SideRecord(window=256, capacity=8)
    rec.add(bytes(32), 29, 0)  # one win short of failing
    rec.add(bytes(range(32)), 3, 4)
    save_sides(path, rec)
    again = SideRecord(window=256, capacity=8)
    load_sides(path, again)
    assert again.get(bytes(32)) == (29.0, 0.0) and again.get(bytes(range(32))) == (3.0, 4.0)
    assert again.add(bytes(32), 1, 0) < math.log(1e-9)
    # entries not well formed are skipped; counts past this record's window are halved into it
    small = SideRecord(window=16, capacity=8)
    n = small.restore({"keys": [["zz" * 32, 1, 0], ["aa" * 32, -1, 0], ["bb" * 32, "x", 0], ["cc" * 32, 40, 8]]})
    assert n == 1 and small.get(bytes.fromhex("cc" * 32)) == (10.0, 2.0)
