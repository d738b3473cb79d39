"""``p2prl bench swarm-sim`` prints the swarm, star and tree figures."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from p2prl.cli.main import app


def test_swarm_sim_prints_trainer_upload_and_times_for_all_three() -> None:
    args = ["bench", "swarm-sim", "--peers", "6", "--patch-mib", "2", "--link-mbit", "50", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    for name in ("swarm", "star", "tree"):
        assert res[name]["complete"] == 6
        assert res[name]["t50_s"] <= res[name]["t90_s"] <= res[name]["t100_s"]
    assert res["star"]["trainer_upload_x"] == 6.0
    assert res["swarm"]["trainer_upload_x"] < 6.0
    bad = CliRunner().invoke(app, ["bench", "swarm-sim", "--peers", "3", "--provider-order", "nope"])
    assert bad.exit_code == 2 and "node or id" in bad.output
