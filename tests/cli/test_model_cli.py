"""``p2prl model`` and ``p2prl eval``: one line for what cannot be done, the figure for what can."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app

runner = CliRunner()


def test_from_gguf_refuses_an_unsupported_architecture_in_one_line(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed")
    import numpy as np

    f = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(f), "rwkv6")
    w.add_tensor("token_embd.weight", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = runner.invoke(app, ["model", "from-gguf", str(f), str(tmp_path / "out")])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: transformers cannot load a GGUF of architecture 'rwkv6'")
    assert not (tmp_path / "out").exists()


def test_fetch_refuses_an_unknown_preset(tmp_path: Path) -> None:
    r = runner.invoke(app, ["model", "fetch", "gpt5", str(tmp_path / "out")])
    assert r.exit_code == 2 and r.stderr.strip() == "error: unknown model 'gpt5'; known: smollm2"


def test_eval_and_train_local_refuse_chat_without_a_template_in_one_line(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for n in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bare / n).write_bytes((smollm2_dir / n).read_bytes())
    for cmd in (["eval"], ["train-local", "--json"]):
        r = runner.invoke(app, [*cmd, "--model", str(bare), "--prompt-format", "chat"])
        assert r.exit_code != 0
        assert r.stderr.strip() == f"error: {bare} has no chat template, so --prompt-format chat cannot work; use raw"


@pytest.mark.slow
def test_eval_on_the_real_model(smollm2_dir: Path) -> None:
    """The held-out figure of SmolLM2-135M-Instruct on chat-style addition (a fixed set: the same
    completions on every run), in the model's derived settings."""
    r = runner.invoke(app, ["eval", "--model", str(smollm2_dir), "--problems", "4", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["prompt_format"] == "chat" and res["task_params"] == {"style": "chat"}
    assert res["max_new_tokens"] == 16 and res["problems"] == 4
    assert 0.0 <= res["accuracy"] <= 1.0 and res["correct"] == round(res["accuracy"] * 4)
    assert res["examples"][0]["prompt"].startswith("What is ")
    again = json.loads(runner.invoke(app, ["eval", "--model", str(smollm2_dir), "--problems", "4", "--json"]).stdout)
    assert again["examples"] == res["examples"]


def test_demo_preset_refusals_start_nothing(tmp_path: Path) -> None:
    r = runner.invoke(app, ["demo", "--preset", "gpt5", "--duration", "1", "--dir", str(tmp_path / "d")])
    assert r.exit_code == 2 and r.stderr.strip() == "error: unknown preset 'gpt5'; known: smollm2"
    r = runner.invoke(app, ["demo", "--preset", "smollm2", "--model", str(tmp_path), "--duration", "1"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: give --model or --preset, not both"
    assert not (tmp_path / "d").exists()


def test_demo_refuses_a_directory_that_is_not_a_causal_lm(tmp_path: Path) -> None:
    d = tmp_path / "vit"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (d / "tokenizer.json").write_text("{}")
    r = runner.invoke(app, ["demo", "--model", str(d), "--duration", "1", "--dir", str(tmp_path / "run")])
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        f"error: {d} is not a causal LM: transformers has no causal-LM class for model_type 'vit'"
    )
    assert not (tmp_path / "run").exists()
