import json

import torch
from typer.testing import CliRunner

from p2prl.patch import changed_fraction
from p2prl.rl.buffer import ReplayBuffer
from p2prl.rl.engine import GenerationParams, HFEngine
from p2prl.rl.grpo import GRPOConfig, GRPOTrainer
from p2prl.rl.model import load_model
from p2prl.rl.tasks import derive_seed, get_task
from p2prl.rl.types import Rollout, RolloutGroup


def _mean_reward(engine, tok, task, problems, prompts, seed: int) -> float:
    out = engine.generate(prompts, 32, GenerationParams(4, seed=seed))
    rs = [task.reward(p, tok.decode(s.completion_ids)) for p, g in zip(problems, out, strict=True) for s in g]
    return sum(rs) / len(rs)


def test_short_grpo_run_improves_reward(default_model_dir) -> None:
    """Generation → reward → buffer → GRPO → bf16 publish on a fixed problem set raises the reward."""
    torch.manual_seed(0)
    task = get_task("addition", digits=2)
    problems = [task.problem(derive_seed("11" * 32, b"test", i)) for i in range(16)]
    master, tok = load_model(default_model_dir, torch.float32)
    policy, _ = load_model(default_model_dir, torch.bfloat16)
    trainer = GRPOTrainer(master, GRPOConfig(lr=1e-3), pad_id=tok.pad_id)
    engine = HFEngine(policy, tok, return_hidden=False)
    buf = ReplayBuffer(max_staleness=1, half_life=1.0, capacity_groups=64)
    prompts = [tok.encode(p.prompt) for p in problems]
    published = trainer.published_state()
    engine.load_state_dict(published)
    before = _mean_reward(engine, tok, task, problems, prompts, seed=999)
    fractions = []
    for step in range(25):
        out = engine.generate(prompts, 8, GenerationParams(4, seed=step))
        for p, ids, g in zip(problems, prompts, out, strict=True):
            rolls = [
                Rollout(s.completion_ids, s.logprobs, task.reward(p, tok.decode(s.completion_ids))) for s in g
            ]
            buf.add(RolloutGroup(ids, rolls, version=trainer.version))
        if trainer.step(buf.sample(trainer.version, 16))["skipped"]:
            continue
        new = trainer.published_state()
        fractions.append(changed_fraction(published, new))
        engine.load_state_dict(new)
        published = new
    after = _mean_reward(engine, tok, task, problems, prompts, seed=999)
    assert fractions and all(0 < f <= 1 for f in fractions)
    assert after > before + 0.1, (before, after)


def test_changed_fraction_compares_bits() -> None:
    a = {"w": torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.bfloat16)}
    b = {"w": torch.tensor([-0.0, 1.0, 2.015625, 3.0], dtype=torch.bfloat16)}
    assert changed_fraction(a, b) == 0.5  # -0.0 == 0.0 as floats, but the bits differ


def test_train_local_cli_json_smoke(default_model_dir, model_cache) -> None:
    from p2prl.cli.main import app

    res = CliRunner().invoke(
        app,
        [
            "train-local",
            "--json",
            "--steps",
            "3",
            "--prompts",
            "8",
            "--samples",
            "4",
            "--cache-dir",
            str(model_cache),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["steps"] == 3
    for key in ("reward_first", "reward_last", "changed_fraction_mean", "greedy_first", "greedy_last"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["model_dir"] == str(default_model_dir)
    assert summary["threads"] == 1 and summary["seconds_per_step"] > 0
    assert summary["world_size"] == 1 and isinstance(summary["first_loss"], float)
