"""Shared fixtures: the default model is built once per test session (or reused from $P2PRL_TEST_CACHE)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model runs fastest on one thread, especially on a shared machine (see p2prl.rl.cpu)."""
    from p2prl.rl.cpu import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("P2PRL_TEST_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("p2prl-cache")


@pytest.fixture(scope="session")
def default_model_dir(model_cache: Path) -> Path:
    from p2prl.rl.model import build_default_model

    return build_default_model(model_cache)
