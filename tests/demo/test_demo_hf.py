"""`p2prl demo --model DIR`: a random-init Qwen3 directory with a chat prompt format, every node its
own process. Miners end on the trainer's weights bit for bit and the validator accepts their rollouts
(it rebuilds each chat-formatted prompt with its own tokenizer: one differing id is a rejection)."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_on_a_hf_chat_model(
    tmp_path: Path, model_cache: Path, hf_model_dir: Callable[..., Path]
) -> None:
    out = tmp_path / "summary.json"
    args = ["--duration", "30", "--miners", "1", "--summary-json", str(out), "--dir", str(tmp_path / "demo")]
    args += ["--model", str(hf_model_dir("qwen3")), "--prompt-format", "chat", "--system-prompt", "Be brief."]
    proc = subprocess.run(
        [sys.executable, "-m", "p2prl", "demo", *args],
        env={**os.environ, "P2PRL_CACHE": str(model_cache)},
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["exit_codes"] == {"trainer": 0, "validator": 0, "miner1": 0}
    (m,) = s["miners"]
    assert m["weights_sha256"] == s["trainer_weights_sha256"] != ""
    assert s["rollouts_accepted"] > 0 and m["groups_accepted"] > 0
    assert not s["rejections"], s["rejections"]
    g = json.loads((tmp_path / "demo" / "genesis.json").read_text())["genesis"]
    assert g["prompt"] == {"format": "chat", "system": "Be brief."}
    assert g["model"]["architecture"] == "Qwen3ForCausalLM"
