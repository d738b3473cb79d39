"""``p2prl bench proof`` end to end on a small model: every case runs, honest miners pass, the cheats
whose detection does not depend on the model's size fail, and the costs are reported."""

from __future__ import annotations

from proofkit import World
from typer.testing import CliRunner

from p2prl.bench.proof import CASES, GROUP_SIZE, ModelSetup, run_setup
from p2prl.cli.main import app
from p2prl.rl.engine import GenerationParams


def test_run_setup_on_a_small_model(world: World) -> None:
    setup = ModelSetup(
        "small",
        world.model,
        world.tok,
        world.task,
        GenerationParams(max_new_tokens=6, temperature=1.0),
        world.other,
    )
    res = run_setup(setup, 2 * GROUP_SIZE, 3e-6, log=lambda _: None, checked_per_group=2)
    assert set(res["cases"]) == set(CASES)
    for case in ("honest_b1", "honest_b8", "honest_b32", "honest_threads"):
        assert res["cases"][case] == (2 * GROUP_SIZE, 2 * GROUP_SIZE), res["details"][case]
    for case in ("other_weights", "tampered_reward", "copied"):
        n, accepted = res["cases"][case]
        assert n == 2 * GROUP_SIZE and accepted == 0, res["details"][case]
    # two of eight rollouts per group recomputed, against all of them for the full cost
    assert res["details"]["honest_b32"]["rollouts_recomputed"] == 2 * 2
    assert res["verify_seconds_per_rollout"] > 0 and res["verify_full_seconds_per_rollout"] > 0
    assert res["generate_seconds_per_rollout"] > 0 and res["blob_bytes_per_token"] > 0
    # grail's sketch on the same kind of states: the honest miner passes it too
    g = res["grail_reference"]
    assert set(g) == {"honest", "other_weights", "perturbed_weights"}
    assert g["honest"]["accepted"] == g["honest"]["n"] == 2 * GROUP_SIZE


def test_cli_rejects_unknown_models() -> None:
    r = CliRunner().invoke(app, ["bench", "proof", "--models", "tiny,huge"])
    assert r.exit_code != 0 and "models must be" in r.output
    r = CliRunner().invoke(app, ["bench", "proof", "--checked-per-group", "-1"])
    assert r.exit_code != 0
    r = CliRunner().invoke(app, ["bench", "honest", "--miner-isa", "sse4"])
    assert r.exit_code != 0 and "--miner-isa must be one of avx2" in r.output
