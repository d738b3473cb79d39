"""A small random model directory for the weights' tests (one per test module)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from p2prl.rl.randmodel import build_random_model_dir

    return build_random_model_dir(tmp_path_factory.mktemp("live") / "m", "qwen2")
