"""The transformers engine with an older CPU's kernels (``--pin-tolerances hf-avx2``): a reference
run that covers miners and validators of two CPU generations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app

runner = CliRunner()


def test_only_known_cpu_generations_and_only_on_the_cpu(tmp_path: Path) -> None:
    from p2prl.node.weights.isa import IsaEngine
    from p2prl.node.weights.reference import reference_proof

    with pytest.raises(ValueError, match="unknown CPU generation 'sse2'"):
        IsaEngine("sse2", None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hf-avx2 is a CPU's engine"):
        reference_proof(None, tmp_path, None, ["hf", "hf-avx2"], device="cuda")  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_avx2_miner_is_judged_with_what_the_reference_run_pinned(tmp_path: Path, model_cache: Path) -> None:
    """``--pin-tolerances hf,hf-avx2``: the reference batches are mined by this CPU's kernels and by
    AVX2's (in a child process whose torch reports AVX2), the genesis names both, and an AVX2 miner's
    batch on other prompts and uniforms is accepted by this CPU's validator judging with them."""
    from p2prl.node.runtime.task import params_of
    from p2prl.node.setup.genesis import read_genesis
    from p2prl.node.weights.disk import load_base_model
    from p2prl.node.weights.isa import IsaEngine
    from p2prl.proof import RolloutValidator, ValidatorConfig
    from p2prl.proof.miner import mine_batch
    from p2prl.rl import get_task

    g = tmp_path / "genesis.json"
    args = ["network", "init", "--out", str(g), "--key", str(tmp_path / "t.key"), "--model-cache", str(model_cache)]
    res = runner.invoke(app, [*args, "--pin-tolerances", "hf,hf-avx2", "--pin-tokens", "2048"])
    assert res.exit_code == 0, res.output
    proof = json.loads(runner.invoke(app, ["network", "show", str(g)]).output)["proof"]
    assert proof["engines"] == ["hf-cpu", "hf-cpu-avx2"] and proof["tokens"] > 0
    genesis = read_genesis(g).genesis
    model, tok, _, h = load_base_model(genesis, model_cache)
    task = get_task(genesis.task.name, **dict(genesis.task.params))
    engine = IsaEngine("avx2", model, tok)
    try:
        assert engine.capability == "AVX2"
        miner = bytes(range(32))
        gen = genesis.generation
        idx = list(range(100, 100 + gen.groups_per_batch))
        p = mine_batch(engine.sized(64), task, 0, h, miner, idx, gen.group_size, params_of(gen))
    finally:
        engine.close()
    cfg = ValidatorConfig.from_genesis(genesis)
    v = RolloutValidator.for_model(model, tok, task, 0, h, config=cfg).check(p.announcement, miner, p.blob, 0)
    assert not v.hard_failure and v.accepted_rollouts == len(idx) * gen.group_size, v.reasons()
