"""Fixtures shared across test packages: small random-init Hugging Face model directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``hf_model_dir(arch)``: a tiny random ``qwen2``/``qwen3``/``llama`` directory with a byte-level
    BPE tokenizer trained on the spot and a ChatML chat template; built once per session and arch."""
    from p2prl.rl.randmodel import build_random_model_dir

    built: dict[tuple[str, int], Path] = {}

    def make(arch: str = "qwen2", shard_kb: int = 0) -> Path:
        key = (arch, shard_kb)
        if key not in built:
            out = tmp_path_factory.mktemp(f"hf-{arch}-{shard_kb}")
            built[key] = build_random_model_dir(out, arch, shard_kb=shard_kb)
        return built[key]

    return make
