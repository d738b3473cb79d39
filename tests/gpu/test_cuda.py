"""Every role on a CUDA device: the learner, the miner's engine and the validator's recomputation,
and a CUDA miner judged by a CPU validator (the volunteer network's common case).

Marked ``gpu`` and skipped with the reason where torch sees no CUDA device.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def test_train_local_on_cuda_learns_and_publishes_cpu_bf16(model_cache: Path) -> None:
    from p2prl.rl.local import LocalConfig, train_local

    steps: list[dict] = []
    summary = train_local(
        LocalConfig(max_steps=3, minutes=5, cache_dir=model_cache, device="cuda", prompts_per_step=8),
        on_step=steps.append,
    )
    assert summary is not None and len(steps) == 3
    assert all(s["changed_fraction"] > 0 for s in steps if "changed_fraction" in s)


def test_grpo_published_state_is_cpu_bf16_and_matches_the_master(model_cache: Path) -> None:
    from p2prl.rl.grpo import GRPOConfig
    from p2prl.rl.local import make_learner
    from p2prl.rl.model import build_default_model, load_model

    master = load_model(build_default_model(model_cache), dtype=torch.float32)[0].to("cuda")
    learner = make_learner(master, GRPOConfig(), 0)
    state = learner.published_state()
    for k, v in state.items():
        assert v.device.type == "cpu" and v.dtype == torch.bfloat16, k
        ref = dict(master.named_parameters()).get(k)
        if ref is not None:
            assert torch.equal(v, ref.detach().to(torch.bfloat16).cpu()), k


def _honest(miner_dev: str, validator_dev: str, model_cache: Path, n_batches: int) -> tuple[int, int]:
    from p2prl.bench.proof import GROUP_SIZE, MINER_A, manifest_of, setups
    from p2prl.proof.calibrate import calibrate
    from p2prl.proof.miner import mine_batch
    from p2prl.proof.validate import RolloutValidator, ValidatorConfig
    from p2prl.rl.engine import HFEngine

    s = setups(model_cache, ("tiny",))[0]
    p = dataclasses.replace(s.params, max_new_tokens=8)
    mh = manifest_of(s.model)
    miner = copy.deepcopy(s.model).to(miner_dev)
    val = copy.deepcopy(s.model).to(validator_dev)
    base = ValidatorConfig(
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        group_size=GROUP_SIZE,
        groups_per_batch=8,
        checked_per_group=0,
    )
    cfg, _ = calibrate(val, s.tokenizer, s.task, p, mh, base)
    v = RolloutValidator.for_model(val, s.tokenizer, s.task, 5, mh, config=cfg)
    n = acc = 0
    for b in range(n_batches):
        eng = HFEngine(miner, s.tokenizer, max_batch=32)
        pb = mine_batch(
            eng,
            s.task,
            5,
            mh,
            MINER_A,
            list(range(8 * b, 8 * b + 8)),
            GROUP_SIZE,
            dataclasses.replace(p, seed=b),
        )
        verdict = v.check(pb.announcement, MINER_A, pb.blob, 5)
        n += pb.batch.n_rollouts
        acc += verdict.accepted_rollouts
    return n, acc


@pytest.mark.parametrize("validator_dev", ["cuda", "cpu"])
def test_cuda_miner_is_accepted_by_a_validator_calibrated_on_its_own_device(
    validator_dev: str, model_cache: Path
) -> None:
    n, acc = _honest("cuda", validator_dev, model_cache, 4)
    assert (n, acc) == (256, 256)


@pytest.mark.slow
def test_demo_with_cuda_trainer_and_miners_and_a_cpu_validator(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "summary.json"
    env = {**os.environ, "P2PRL_CACHE": str(model_cache)}
    args = [
        "demo",
        "--duration",
        "40",
        "--miners",
        "2",
        "--device",
        "cuda",
        "--validator-device",
        "cpu",
        "--summary-json",
        str(out),
        "--dir",
        str(tmp_path / "demo"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "p2prl", *args], env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(out.read_text())
    keep = os.environ.get("P2PRL_TEST_OUT")  # the device run copies the summary back
    if keep:
        Path(keep, "demo_cuda_summary.json").write_text(out.read_text())
    assert s["versions_published"] >= 3, s
    assert s["groups_accepted"] > 0 and s["groups_rejected"] == 0, (s["rejections"], s["proof"])
    assert s["miners_version"] == s["trainer_version"], s
    assert all(m["weights_sha256"] == s["trainer_weights_sha256"] != "" for m in s["miners"]), s
