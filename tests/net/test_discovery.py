"""Peers find each other without a bootstrap list when mDNS is on, and not when it is off; a node
with mDNS stops without leaving threads behind."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.store import BlobStore


def _multicast_works() -> bool:
    """Send one datagram to a multicast group and read it back (some sandboxes have no route)."""
    group = "239.255.77.77"
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.bind(("", 0))
        port = rx.getsockname()[1]
        rx.setsockopt(
            socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4sl", socket.inet_aton(group), 0)
        )
        rx.settimeout(1.0)
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        tx.sendto(b"p2prl-probe", (group, port))
        return rx.recv(64) == b"p2prl-probe"
    except OSError:
        return False
    finally:
        rx.close()
        tx.close()


def _connected(nodes: list[P2PNode], within: float) -> bool:
    want = [{m.peer_id for m in nodes if m is not n} for n in nodes]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        have = [{p.peer_id for p in n.peers() if p.connected} for n in nodes]
        if all(w <= h for w, h in zip(want, have, strict=True)):
            return True
        time.sleep(0.25)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("mdns", [True, False])
def test_mdns_discovery(tmp_path, mdns: bool, assert_no_thread_leak) -> None:
    if mdns and not _multicast_works():
        pytest.skip("this machine does not deliver multicast datagrams")
    nodes = [
        P2PNode(Identity.generate(), "disc", BlobStore(tmp_path / str(i)), NetConfig(mdns=mdns))
        for i in range(3)
    ]
    try:
        for n in nodes:
            n.start()
        # no bootstrap, no connect(): only mDNS can bring them together
        assert _connected(nodes, 30.0 if mdns else 8.0) is mdns
    finally:
        for n in nodes:
            n.stop()
    assert_no_thread_leak()
