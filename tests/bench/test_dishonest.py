"""The dishonest miner: its noise, its command line, and the demo's use of it."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from p2prl.bench.dishonest import perturb_state
from p2prl.cli.main import app
from p2prl.demo.launcher import DemoOptions, _node_args
from p2prl.node.setup.config import NodeConfig


def test_perturb_state_is_relative_and_deterministic() -> None:
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(64, 64, generator=g).to(torch.bfloat16), "b": torch.zeros(1)}
    a, b = perturb_state(state, 0.05, seed=3), perturb_state(state, 0.05, seed=3)
    assert all(torch.equal(a[k], b[k]) for k in state)
    assert not torch.equal(a["w"], perturb_state(state, 0.05, seed=4)["w"])
    rel = float((a["w"].float() - state["w"].float()).std() / state["w"].float().std())
    assert 0.03 < rel < 0.07 and a["w"].dtype == torch.bfloat16


def test_the_cheat_is_no_node_setting() -> None:
    assert not any("perturb" in f for f in NodeConfig.__dataclass_fields__)


def test_demo_runs_miner2_as_the_dishonest_miner(tmp_path: Path) -> None:
    plan = {"genesis": tmp_path / "g.json", "model_cache": tmp_path, "trainer_port": 1}
    plan["nodes"] = {n: {"status_port": 2} for n in ("miner1", "miner2")}
    opts = DemoOptions(dishonest_miner=True)
    honest, cheat = (_node_args(opts, tmp_path, plan, n, "") for n in ("miner1", "miner2"))
    assert "node" in honest and "bench" not in honest
    i = cheat.index("bench")
    assert cheat[i + 1] == "dishonest-miner" and "node" not in cheat
    assert cheat[i + 2 :] == [a.replace("miner1", "miner2") for a in honest[i + 1 :]]
    # the command takes every node option: it gets as far as reading the (missing) genesis
    r = CliRunner().invoke(app, [*cheat[2:], "--perturb", "0.05"])
    assert r.exit_code == 1 and "g.json" in r.output, r.output
