"""Dial-back: a reachable node is confirmed at the address its helper saw, a closed port is not, and
a helper cannot be driven to dial often or garbage-in to crash."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import pytest
from dialbackkit import ask_raw

from p2prl.net import dialback
from p2prl.net.node import P2PNode


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


def test_reachable_node_is_confirmed(make_node: Callable[..., P2PNode]) -> None:
    a, b = make_node("a"), make_node("b")
    b.connect(a.addrs[0])
    assert _wait(lambda: b.reachable is not None, 15)
    assert b.reachable is True and b.advertised_addrs() == [b.addrs[0]]
    assert b.stats()["reachable"] == 1


@pytest.mark.slow
def test_helper_is_bounded_and_survives_garbage(make_node: Callable[..., P2PNode]) -> None:
    helper, asker = make_node("helper"), make_node("asker")
    asker.connect(helper.addrs[0])
    assert _wait(lambda: asker.reachable is not None, 15)  # the node's own check used its turn
    # a second request inside PER_PEER_S is refused (reset): a peer cannot make us dial on demand
    out = asker._call(ask_raw, asker, helper.peer_id, dialback.encode_request([1]))
    assert not out.startswith(b"\x09127.0.0.1"), out
    assert helper.stats().get("dialback.refused", 0) >= 1
    # garbage (200 ports announced) from a peer with its turn still unused: closed, nothing dialed
    rogue = make_node("rogue")
    answered = helper.stats().get("dialback.answered", 0)
    rogue.connect(helper.addrs[0])
    out = rogue._call(ask_raw, rogue, helper.peer_id, struct.pack(">B", 200) + bytes(400))
    assert not out.startswith(b"\x09"), out
    # the helper still answers others
    late = make_node("late")
    late.connect(helper.addrs[0])
    assert _wait(lambda: late.reachable is True, 15)
    assert helper.stats().get("dialback.answered", 0) >= answered + 1
