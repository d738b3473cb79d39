"""GGUF → model directory: the real SmolLM2-135M-Instruct package, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from p2prl.rl.ggufdir import convert, gguf_architecture, supported_architectures
from p2prl.rl.modeldir import ModelDirError

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'p2prl[gguf]')")


def _write_gguf(path: Path, arch: str) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_is_one_line(tmp_path: Path) -> None:
    f = _write_gguf(tmp_path / "m.gguf", "rwkv6")
    assert gguf_architecture(f) == "rwkv6"
    assert "rwkv6" not in supported_architectures() and "llama" in supported_architectures()
    with pytest.raises(ModelDirError, match=r"cannot load a GGUF of architecture 'rwkv6' \(it reads: .*llama"):
        convert(f, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no temporary directory left behind


def test_not_gguf_missing_and_existing_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelDirError, match="is not a readable GGUF file"):
        convert(bad, tmp_path / "out")
    with pytest.raises(ModelDirError, match="is not a file"):
        convert(tmp_path / "absent.gguf", tmp_path / "out")
    (tmp_path / "exists").mkdir()
    with pytest.raises(ModelDirError, match="exists; convert into a new directory"):
        convert(bad, tmp_path / "exists")


@pytest.mark.slow
def test_smollm2_package_converts_to_an_ordinary_directory(smollm2_dir: Path) -> None:
    """The converted package loads as any HF directory: Llama, 134.5M parameters, bf16 safetensors,
    its chat template, no trace of the GGUF, and stops at <|im_end|> and <|endoftext|>."""
    from p2prl.rl.modeldir import describe, has_chat_template

    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    assert has_chat_template(smollm2_dir)
    spec, stops, model = describe(smollm2_dir)
    assert spec.architecture == "LlamaForCausalLM"
    assert spec.parameters == 134_515_008
    tok = __import__("transformers").AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    assert tok.convert_ids_to_tokens(list(stops)) == ["<|im_end|>", "<|endoftext|>"]
    assert next(model.parameters()).dtype.is_floating_point
