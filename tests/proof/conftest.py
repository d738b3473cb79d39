"""The proof tests' shared world: one small model pair, built once per session."""

import pytest
from proofkit import World, make_world


@pytest.fixture(scope="session")
def world() -> World:
    return make_world()
