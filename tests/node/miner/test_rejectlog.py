"""A miner's rejected groups reach its log: one line per reason a minute, with a hint."""

from __future__ import annotations

import logging

import pytest

from p2prl.node.miner.rejectlog import RejectionLog
from p2prl.reasons import VerdictReason as R


def test_rejections_are_logged_once_a_minute_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    rl = RejectionLog(every_s=60)
    with caplog.at_level(logging.WARNING, logger="p2prl.node.miner.miner"):
        lines = rl.add(3, [R.UNREACHABLE] * 4 + [R.OK], now=0.0)
        assert lines == [f"4 group(s) rejected as unreachable (v3): {lines[0].split(': ', 1)[1]}"]
        assert "--local-network" in lines[0]
        assert rl.add(3, [R.UNREACHABLE] * 4, now=10.0) == []  # held back, counted
        assert rl.add(4, [R.FINGERPRINT], now=11.0) == ["1 group(s) rejected as fingerprint (v4)"]
        assert rl.add(4, [R.UNREACHABLE] * 2, now=61.0)[0].startswith("6 group(s) rejected as unreachable")
        assert rl.add(4, [], now=62.0) == []
        assert rl.add(5, [f"made-up-{i}" for i in range(100)], now=63.0) == ["100 group(s) rejected as other (v5)"]
        assert len(rl._last) == 3  # unknown codes from a verdict share one entry
    levels = {r.getMessage().split(" rejected as ")[1].split(" ")[0]: r.levelno for r in caplog.records}
    assert levels == {"unreachable": logging.WARNING, "fingerprint": logging.ERROR, "other": logging.WARNING}


def test_a_node_on_a_local_network_is_not_told_to_add_the_flag() -> None:
    """Every demo node runs with --local-network; on a loaded machine a batch can still miss the
    validator's probe, and the hint said to start every node with the flag they all had."""
    line = RejectionLog(local_network=True).add(1, [R.UNREACHABLE] * 16, now=0.0)[0]
    assert "runs with --local-network" in line and "start every node with" not in line
    assert "start every node with --local-network" in RejectionLog().add(1, [R.UNREACHABLE], now=0.0)[0]
    gap = RejectionLog(local_network=True).add(1, [R.INDEX_GAP], now=0.0)[0]
    assert "--local-network" not in gap
