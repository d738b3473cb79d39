"""Fixtures every test directory may use: real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.net.store import BlobStore


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
