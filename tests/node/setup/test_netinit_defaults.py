"""`p2prl network init --model DIR` derives the generation settings from the model where none is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.slow


def _init(tmp_path: Path, *flags: str) -> tuple[int, str, dict]:
    out = tmp_path / "genesis.json"
    r = runner.invoke(
        app, ["network", "init", "--out", str(out), "--key", str(tmp_path / "node.key"), "--validator", "ab" * 32, *flags]
    )
    g = json.loads(out.read_text())["genesis"] if out.exists() else {}
    return r.exit_code, r.stderr, g


def test_a_chat_model_gets_its_own_settings(smollm2_dir: Path, tmp_path: Path) -> None:
    code, err, g = _init(tmp_path / "a", "--model", str(smollm2_dir))
    assert code == 0, err
    assert g["prompt"]["format"] == "chat"
    assert g["generation"]["max_new_tokens"] == 16
    assert g["generation"]["stop_token_ids"] == [2, 0]  # <|im_end|>, <|endoftext|>
    assert g["task"]["name"] == "addition" and g["task"]["params"] == {"style": "chat"}
    # what the user gives wins
    code, err, g = _init(
        tmp_path / "b", "--model", str(smollm2_dir), "--prompt-format", "raw", "--max-new-tokens", "8"
    )
    assert code == 0, err
    assert (g["prompt"]["format"], g["generation"]["max_new_tokens"], g["task"]["params"]) == ("raw", 8, {})


def test_chat_without_a_template_writes_nothing(smollm2_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for n in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (bare / n).symlink_to(smollm2_dir / n)
    code, err, g = _init(tmp_path, "--model", str(bare), "--prompt-format", "chat")
    assert code == 1 and not g
    assert err.strip() == f"error: {bare} has no chat template, so --prompt-format chat cannot work; use raw"
