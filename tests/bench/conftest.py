"""The benchmark tests reuse the proof tests' small model pair (tests/proof/proofkit.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proof"))
from proofkit import World, make_world


@pytest.fixture(scope="session")
def world() -> World:
    return make_world()
