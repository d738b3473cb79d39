"""Generation defaults derived from the model, and the one-line refusals of what it cannot serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from p2prl.rl.gendefaults import MODEL_NEW_TOKENS, TOY_NEW_TOKENS, run_defaults
from p2prl.rl.modeldir import ModelDirError


def _files_only(src: Path, dst: Path, drop: tuple[str, ...] = ()) -> Path:
    """The non-weight files of ``src`` (the defaults never read weights)."""
    dst.mkdir()
    for n in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / n).is_file() and n not in drop:
            shutil.copy(src / n, dst / n)
    return dst


def test_builtin_model_keeps_the_toy_settings() -> None:
    d = run_defaults(None)
    assert (d.prompt_format, d.max_new_tokens, d.task_params) == ("raw", TOY_NEW_TOKENS, {"digits": 2})
    assert run_defaults(None, "addition", {"digits": 3}, max_new_tokens=6).max_new_tokens == 6


@pytest.mark.slow
def test_a_chat_model_gets_chat_prompts_room_and_the_chat_style(smollm2_dir: Path, tmp_path: Path) -> None:
    d = run_defaults(smollm2_dir)
    assert d.prompt_format == "chat"
    assert d.max_new_tokens == MODEL_NEW_TOKENS["addition"] > TOY_NEW_TOKENS
    assert d.task_params == {"style": "chat"}
    # what the user gives wins
    d = run_defaults(smollm2_dir, "addition", {"style": "exact"}, "raw", 8)
    assert (d.prompt_format, d.max_new_tokens, d.task_params) == ("raw", 8, {"style": "exact"})
    # the same tokenizer without its template: raw by default, and chat refused in one line
    bare = _files_only(smollm2_dir, tmp_path / "bare", drop=("chat_template.jinja",))
    assert run_defaults(bare).prompt_format == "raw"
    with pytest.raises(ModelDirError, match="has no chat template, so --prompt-format chat cannot work"):
        run_defaults(bare, prompt_format="chat")


@pytest.mark.slow
def test_a_directory_that_is_not_a_causal_lm_is_one_line(smollm2_dir: Path, tmp_path: Path) -> None:
    enc = _files_only(smollm2_dir, tmp_path / "bert")
    cfg = json.loads((enc / "config.json").read_text())
    (enc / "config.json").write_text(json.dumps({**cfg, "model_type": "vit"}))
    with pytest.raises(ModelDirError, match=r"is not a causal LM: .* model_type 'vit'"):
        run_defaults(enc)
    (enc / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelDirError, match=r"is not a causal LM: config\.json names no model_type"):
        run_defaults(enc)
    with pytest.raises(ModelDirError, match=r"has no config\.json"):
        run_defaults(tmp_path)
