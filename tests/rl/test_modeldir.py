"""Local HF model directories: described for genesis, checked, refused with one line when unusable."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.rl.modeldir import ModelDirError, describe, pack_files, unpack_files
from p2prl.rl.tokenizer import CharTokenizer, TextTokenizer, load_tokenizer


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def init(tmp_path: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(
        app,
        ["network", "init", "--out", str(tmp_path / "g.json"), "--key", str(tmp_path / "k" / "t.key"), *args],
    )
    return res.exit_code, res.output


def test_network_init_pins_any_model(tmp_path: Path, hf_model_dir: Callable[..., Path]) -> None:
    d = hf_model_dir("llama", shard_kb=20)  # sharded: several safetensors files and an index
    assert len(list(d.glob("model-*.safetensors"))) > 1
    code, out = init(tmp_path, "--model", str(d), "--prompt-format", "chat", "--system-prompt", "Be brief.")
    assert code == 0, out
    g = json.loads((tmp_path / "g.json").read_text())["genesis"]
    spec, stops, _ = describe(d)
    assert g["model"] == {**spec.__dict__, "name": d.name}
    assert g["model"]["architecture"] == "LlamaForCausalLM" and g["model"]["parameters"] > 0
    assert g["prompt"] == {"format": "chat", "system": "Be brief."}
    assert g["generation"]["stop_token_ids"] == list(stops) and len(stops) == 2
    # a chat model's addition reads the stated answer (p2prl.rl.gendefaults)
    assert g["task"] == {"name": "addition", "params": {"style": "chat"}, "data_sha256": ""}


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("no_weights", "no safetensors weights"),
        ("no_tokenizer", "no tokenizer files"),
        ("bad_arch", "is not a causal LM: transformers has no causal-LM class for model_type 'no-such-model'"),
        ("lost_shard", "shards named"),
        ("extra_key", "do not add up"),
    ],
)
def test_network_init_refuses_unusable_dirs(
    tmp_path: Path, hf_model_dir: Callable[..., Path], breakage: str, message: str
) -> None:
    d = copy_dir(hf_model_dir("llama", shard_kb=20), tmp_path / "m")
    index = d / "model.safetensors.index.json"
    if breakage == "no_weights":
        for f in d.glob("model*.safetensors*"):
            f.unlink()
    elif breakage == "no_tokenizer":
        (d / "tokenizer.json").unlink()
    elif breakage == "bad_arch":
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(model_type="no-such-model", architectures=["NoSuchForCausalLM"])
        (d / "config.json").write_text(json.dumps(cfg))
    elif breakage == "lost_shard":
        sorted(d.glob("model-*.safetensors"))[-1].unlink()
    else:
        idx = json.loads(index.read_text())
        idx["weight_map"]["model.layers.9.mlp.up_proj.weight"] = next(iter(idx["weight_map"].values()))
        index.write_text(json.dumps(idx))
    code, out = init(tmp_path, "--model", str(d))
    assert code == 1
    assert message in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "g.json").exists() and not (tmp_path / "k").exists()  # nothing written


def test_files_blob_roundtrip_and_hostile_entries(tmp_path: Path, hf_model_dir: Callable[..., Path]) -> None:
    d = hf_model_dir("qwen2")
    blob = pack_files(d)
    assert pack_files(d) == blob  # deterministic: every node computes the same hash
    names = unpack_files(blob, tmp_path / "out")
    assert "config.json" in names and "tokenizer.json" in names and "model.safetensors" not in names
    for bad in ("../evil", "model.safetensors"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(bad)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(ModelDirError, match="unexpected entry"):
            unpack_files(buf.getvalue(), tmp_path / "bad")
    assert not (tmp_path / "evil").exists()


def test_char_vocabulary_is_an_ordinary_tokenizer(tmp_path: Path) -> None:
    tok = CharTokenizer()
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    text = "12+34=\n x~"
    assert back.encode(text) == tok.encode(text) == [20, 21, 14, 22, 23, 32, 98, 3, 91, 97]
    assert back.decode([*back.encode(text), 1, 0]) == text and back.vocab_size == 99


def test_chat_prompts_are_the_same_ids_everywhere(hf_model_dir: Callable[..., Path]) -> None:
    d = hf_model_dir("qwen3")
    a = load_tokenizer(d, "chat", "Answer with the number.")
    b = load_tokenizer(d, "chat", "Answer with the number.")
    text = a.prompt_text("3+4=")
    assert text.startswith("<|im_start|>system\nAnswer with the number.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert a.encode_prompt("3+4=") == b.encode_prompt("3+4=") != a.encode("3+4=")

    raw = load_tokenizer(d).tok
    raw.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        TextTokenizer(raw, "chat")


def test_train_local_on_a_chat_model(hf_model_dir: Callable[..., Path]) -> None:
    from p2prl.rl.local import LocalConfig, train_local

    cfg = LocalConfig(
        model_dir=hf_model_dir("qwen3"),
        task_params={"digits": 1},
        prompt_format="chat",
        max_steps=1,
        prompts_per_step=2,
        samples_per_prompt=2,
        max_new_tokens=2,
        eval_problems=2,
    )
    s = train_local(cfg)
    assert s["steps"] == 1 and s["model_dir"] == str(cfg.model_dir)
