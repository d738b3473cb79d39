"""A bootstrap peer that is down, wrong or of another network: a message that says what to check,
retries with backoff, and the connection once the peer is there."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.identity import peer_id_for
from p2prl.net.node import P2PNode
from p2prl.net.topics import heartbeats_topic
from p2prl.store import BlobStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


def _connected(node: P2PNode, peer: str) -> bool:
    return any(p.peer_id == peer and p.connected for p in node.peers())


@pytest.mark.slow
def test_bootstrap_down_then_up(
    make_node: Callable[..., P2PNode], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="p2prl.net.node")
    port = _free_port()
    ident = Identity.generate()
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_for(ident)}"
    node = make_node("b", config=NetConfig(bootstrap=[addr]))
    assert _wait(lambda: node.stats().get("bootstrap_failures", 0) >= 2, 10)
    msgs = [r.getMessage() for r in caplog.records if "bootstrap peer" in r.getMessage()]
    assert "connection refused" in msgs[0] and "is the node running" in msgs[0], msgs
    assert "retrying in 1 s" in msgs[0] and "retrying in 2 s" in msgs[1], msgs  # backoff
    # the peer comes up on that address: the node connects by itself
    up = P2PNode(ident, "testnet", BlobStore(tmp_path / "up"), NetConfig(listen=f"/ip4/127.0.0.1/tcp/{port}"))
    up.start()
    try:
        assert _wait(lambda: _connected(node, up.peer_id), 20)
    finally:
        up.stop()


def test_bootstrap_wrong_peer_id(make_node: Callable[..., P2PNode], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="p2prl.net.node")
    real = make_node("a")
    wrong = real.addrs[0].rsplit("/p2p/", 1)[0] + "/p2p/" + peer_id_for(Identity.generate())
    node = make_node("b", config=NetConfig(bootstrap=[wrong]))
    assert _wait(lambda: node.stats().get("bootstrap_failures", 0) >= 1, 15)
    msg = next(r.getMessage() for r in caplog.records if "bootstrap peer" in r.getMessage())
    assert "handshake failed" in msg and "peer id" in msg, msg


@pytest.mark.slow
def test_bootstrap_of_another_network(
    make_node: Callable[..., P2PNode], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="p2prl.net.node")
    other = make_node("a", network="othernet")
    other.subscribe(heartbeats_topic("othernet"))
    node = make_node("b", config=NetConfig(bootstrap=[other.addrs[0]]))
    node.subscribe(heartbeats_topic("testnet"))
    assert _wait(lambda: node.stats().get("bootstrap_foreign", 0) == 1, 30)
    msg = next(r.getMessage() for r in caplog.records if "another network" in r.getMessage())
    assert "othernet" in msg and "genesis" in msg, msg


@pytest.mark.slow
def test_an_invalid_bootstrap_address_is_reported_once_and_skipped(
    make_node: Callable[..., P2PNode], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="p2prl.net.node")
    node = make_node("b", config=NetConfig(bootstrap=["/ip4/127.0.0.1/tcp/4001"]))  # no /p2p/<peer id>
    assert _wait(lambda: node.stats().get("bootstrap_failures", 0) >= 1, 10)
    time.sleep(3.5)  # retries would come at 1 s and 2 s
    msgs = [r.getMessage() for r in caplog.records if "bootstrap peer" in r.getMessage()]
    assert node.stats()["bootstrap_failures"] == 1 and len(msgs) == 1, msgs
    assert "not a valid address" in msgs[0] and msgs[0].endswith("skipped")
