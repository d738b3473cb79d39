"""`p2prl demo --duration N` exits non-zero on a PROBLEM verdict and says which check failed, so a
script or CI can use it as a check (it exited 0 on PROBLEM).

The network run itself is the demo tests' (tests/demo); here ``run_demo`` hands back finished runs'
summaries and the command's exit is checked."""

from typing import Any

import pytest
from typer.testing import CliRunner

import p2prl.demo
from p2prl.cli.main import app
from p2prl.cli.node import DEMO_FAILED, DEMO_PROBLEM, demo_exit

MINER = {"name": "miner1", "version": 3, "weights_hash": "h3", "score": 5, "groups_accepted": 4}
OK = {
    "versions_published": 3,
    "trainer_version": 3,
    "trainer_weights_hash": "h3",
    "miners": [MINER],
    "groups_accepted": 4,
    "groups_rejected": 0,
    "rejections": {},
    "checks": {"honest": {"ok": True, "detail": "honest miners: nothing rejected for its content, every score > 0"}},
}
BEHIND = {**OK, "miners": [{**MINER, "version": 2}]}
REJECTED = {**OK, "checks": {"honest": {"ok": False, "detail": "honest miners: rejected {'sampling': 1}"}}}


def _run(monkeypatch: pytest.MonkeyPatch, summary: dict[str, Any]) -> Any:
    monkeypatch.setattr(p2prl.demo, "run_demo", lambda opts: summary)
    return CliRunner().invoke(app, ["demo", "--duration", "1"])


def test_ok_exits_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(monkeypatch, OK)
    assert res.exit_code == 0, res.output
    assert "verdict: OK" in res.output


@pytest.mark.parametrize(("summary", "check"), [(BEHIND, "in_sync"), (REJECTED, "honest")])
def test_a_failed_check_exits_non_zero_and_is_named(
    monkeypatch: pytest.MonkeyPatch, summary: dict[str, Any], check: str
) -> None:
    res = _run(monkeypatch, summary)
    assert res.exit_code == DEMO_PROBLEM, res.output
    assert f"verdict: PROBLEM ({check})" in res.output
    assert f"demo: PROBLEM: check failed: {check} (" in res.output


def test_a_failed_run_exits_one(monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(monkeypatch, {"error": "miner1 exited with 1:\ntraceback"})
    assert res.exit_code == DEMO_FAILED == 1, res.output
    assert "demo: FAILED: miner1 exited with 1" in res.output
    assert demo_exit(OK) == (0, "")
