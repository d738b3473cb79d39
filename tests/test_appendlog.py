"""An append-only JSON-lines file: replayed as written, a torn line skipped, rewritten from its
owner's state once doubled, a failed write logged and not raised."""

from __future__ import annotations

from pathlib import Path

from p2prl.appendlog import AppendLog


def test_records_replay_in_order_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    log = AppendLog(path)
    log.append([{"a": 1}, {"a": 2}])
    log.append([])
    log.close()
    path.write_text(path.read_text() + '[1, 2]\n{"a": 3')  # not a record, then a crash mid-write
    assert list(AppendLog(path).replay()) == [{"a": 1}, {"a": 2}]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_rewrite_is_due_once_the_file_doubled(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    log = AppendLog(path, min_lines=3)
    log.append({"i": i} for i in range(3))
    assert not log.due()
    log.append([{"i": 3}])
    assert log.due()
    log.rewrite(lambda: [{"i": 9}] * 4)
    assert not log.due()
    log.append([{"i": 10}] * 4)
    assert not log.due()  # four kept: due past four more
    log.append([{"i": 11}])
    assert log.due()
    log.close()
    assert [r["i"] for r in AppendLog(path).replay()] == [9] * 4 + [10] * 4 + [11]


def test_a_failed_write_is_logged_not_raised(tmp_path: Path, caplog) -> None:
    (tmp_path / "blocked").write_text("a file where a directory should be")
    log = AppendLog(tmp_path / "blocked" / "state.jsonl")
    log.append([{"a": 1}])
    log.rewrite(lambda: [{"a": 1}])
    assert not log.due() and "not kept" in caplog.text and "not rewritten" in caplog.text


def test_without_a_path_nothing_is_kept() -> None:
    log = AppendLog(None)
    log.append([{"a": 1}])
    log.rewrite(lambda: [{"a": 1}])
    assert not log.due() and list(log.replay()) == []
