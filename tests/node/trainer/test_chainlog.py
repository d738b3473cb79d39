"""The trainer's record of its receipt chains: replayed as written, a torn line skipped, rewritten
compacted when it grows."""

from __future__ import annotations

from pathlib import Path

from p2prl.lru import LRU
from p2prl.node.trainer import chainlog as C

A, B = "aa" * 32, "bb" * 32
BLOB1, BLOB2, LIST = "11" * 32, "22" * 32, "dd" * 32


def _state() -> C.ChainState:
    return C.ChainState(LRU(4), LRU(4), LRU(4))


def test_the_log_replays_receipts_decisions_and_bars(tmp_path: Path) -> None:
    path = tmp_path / "chains.jsonl"
    log = C.ChainLog(path)
    log.sent([(A, BLOB1, LIST), (B, BLOB2, LIST)])
    log.used(B, BLOB2)
    log.decided(A, BLOB1, vetoed=False)
    log.decided(B, BLOB2, vetoed=True)
    log.decided(B, BLOB2, vetoed=False)  # a veto is never undone
    log.barred(B, 9)
    log.close()
    with path.open("a") as f:
        f.write('{"k": "sent", "s": "zz", "b": "11"}\n{"k": "used", "s": "' + A)  # junk, then a torn line
    state = C.ChainLog(path).load(_state())
    assert dict(state.sent) == {(A, BLOB1): LIST}
    assert dict(state.decided) == {(A, BLOB1): False, (B, BLOB2): True}
    assert dict(state.barred) == {B: 9}
    assert len(path.read_text().splitlines()) == 4  # rewritten compacted at load


def test_the_log_is_rewritten_from_its_owners_state_when_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "chains.jsonl"
    log = C.ChainLog(path, min_lines=8)
    for i in range(5):
        log.sent([(A, f"{i:064x}", LIST)])
        log.used(A, f"{i:064x}")
    assert log.due()
    state = _state()
    state.sent.put((B, BLOB2), LIST)
    log.compact(lambda: state)
    assert not log.due() and len(path.read_text().splitlines()) == 1
    log.used(B, BLOB2)  # appends go on after a rewrite
    log.close()
    assert len(C.ChainLog(path).load(_state()).sent) == 0


def test_without_a_path_nothing_is_kept(tmp_path: Path) -> None:
    log = C.ChainLog(None)
    log.sent([(A, BLOB1, LIST)])
    assert not log.due() and log.load(_state()).sent == {}
