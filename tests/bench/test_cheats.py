"""``p2prl bench cheats``'s ``pinned`` column: tolerances from a reference run over this CPU's and an
AVX2 CPU's kernels, an AVX2 miner's honest batches judged with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app


def test_unknown_columns_are_refused() -> None:
    r = CliRunner().invoke(app, ["bench", "cheats", "--columns", "node,pinnned"])
    assert r.exit_code != 0 and "pinnned" in r.output


@pytest.mark.slow
def test_the_pinned_column_judges_an_avx2_miner_with_the_reference_runs_tolerances(model_cache: Path) -> None:
    from p2prl.bench.cheats import run

    res = run(
        model_cache,
        rollouts=128,
        log=lambda _: None,
        columns=("node", "pinned"),
        cases=("honest", "other_model"),
    )
    rows = {c: {r["case"]: r for r in t} for c, t in res["columns"].items()}
    assert rows["pinned"]["honest"]["accepted"] == rows["pinned"]["honest"]["n"] == 128, rows["pinned"]["honest"]
    assert rows["pinned"]["other_model"]["accepted"] == 0 and rows["pinned"]["other_model"]["hard"] == 1
    pinned, node = res["tolerances"]["pinned"], res["tolerances"]["node"]
    # the reference run holds the looser of the two CPUs' drift: never below this CPU's own
    assert pinned["sampling_margin"] >= node["sampling_margin"] > 0
    assert pinned["fingerprint_tol"] >= node["fingerprint_tol"] > 0
