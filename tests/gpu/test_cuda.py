"""Every role on a CUDA device: the learner, the miner's engine and the validator's recomputation,
and a CUDA miner judged by a CPU validator (the volunteer network's common case).

Marked ``gpu`` and skipped with the reason where torch sees no CUDA device.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("validator_dev", ["cuda", "cpu"])
def test_cuda_miner_is_accepted_by_a_validator_calibrated_on_its_own_device(
    validator_dev: str, model_cache: Path
) -> None:
    from p2prl.bench.proof import honest_acceptance

    r = honest_acceptance(
        model_cache,
        256,
        ("tiny",),
        batch_sizes=(32,),
        threads=(torch.get_num_threads(),),
        log=lambda *_: None,
        miner_device="cuda",
        validator_device=validator_dev,
        max_new_tokens=8,
    )
    assert (r["rollouts"], r["accepted"]) == (256, 256), r


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
