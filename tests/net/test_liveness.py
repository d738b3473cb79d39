"""A connected, subscribed peer that pubsub holds no stream to gets gossip again, in bounded time.

py-libp2p 0.8.1 queues messages for such a peer "until identify completes" and never flushes them
(docs/NETWORK.md, "Stuck pubsub peers"). The tests put a real host into exactly that state (the
peer dropped from pubsub and its router, its subscriptions kept, no retry scheduled) and check the
connection watch's sweep repairs it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from tcprelay import TcpRelay

from p2prl.crypto.keys import Identity
from p2prl.net import liveness
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.net.topics import heartbeats_topic
from p2prl.protocol import Heartbeat, encode_message
from p2prl.store import BlobStore

NET = "testnet"
HB = heartbeats_topic(NET)


def node(root: Path) -> P2PNode:
    n = P2PNode(Identity.generate(), NET, BlobStore(root), NetConfig())
    n.start()
    n.subscribe(HB)
    return n


def beat(n: P2PNode, version: int) -> bytes:
    return encode_message(n.identity, NET, Heartbeat("miner", version, "p", (), (), {}))


def delivered(sender: P2PNode, receiver: P2PNode, version: int, timeout: float) -> bool:
    """Publish fresh heartbeats until the receiver has one of ``version`` from ``sender``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sender.publish(HB, beat(sender, version))
        got = receiver.poll(0.5)
        if any(i.message.version == version and i.origin == sender.peer_id for i in got):
            return True
    return False


def counted(n: P2PNode, key: str, timeout: float) -> int:
    """``n``'s counter ``key`` once it is non-zero (0 after timeout)."""
    deadline = time.monotonic() + timeout
    while not n.stats().get(key, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    return n.stats().get(key, 0)


class StallRelay(TcpRelay):
    """A relay that can stall: it then stops reading either side and closes nothing, as a peer that
    stopped reading or a flow a NAT forgot would (writes pile up)."""

    def __init__(self, target_port: int) -> None:
        self.stalled = threading.Event()
        super().__init__(target_port)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.1)
        while not self.closed.is_set():
            if self.stalled.is_set():
                self.closed.wait(0.1)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                dst.sendall(data)
            except OSError:
                return


def wedge(n: P2PNode, peer: str) -> None:
    """On ``n``: forget pubsub's stream to ``peer`` and the router's record of it, keep the peer's
    subscriptions, schedule no retry (the state a hung or abandoned stream retry leaves)."""
    from libp2p.peer.id import ID

    def run() -> None:
        pid = ID.from_base58(peer)
        ps = n._pubsub
        del ps.peers[pid]
        ps.peer_queues.pop(pid).close()
        ps.router.remove_peer(pid)
        assert any(pid in peers for peers in ps.peer_topics.values())

    n._call_sync(run)


@pytest.mark.slow
def test_stuck_peer_gets_gossip_again(tmp_path: Path) -> None:
    a, b = node(tmp_path / "a"), node(tmp_path / "b")
    try:
        b.connect(a.addrs[0])
        assert delivered(a, b, 1, 20) and delivered(b, a, 1, 20)
        wedge(a, b.peer_id)
        t0 = time.monotonic()
        assert delivered(a, b, 2, 25), a.stats()
        assert time.monotonic() - t0 < 25
        assert counted(a, "pubsub_repaired", 5) >= 1
        assert delivered(b, a, 3, 10)
    finally:
        b.stop()
        a.stop()


@pytest.mark.slow
def test_stuck_both_ways_behind_a_forwarder(tmp_path: Path) -> None:
    """``a`` and ``m`` each lost their stream to the other; ``t`` is connected to both. Gossip
    between them goes through ``t`` meanwhile (the stuck state drops nothing inbound), and the
    sweep on each side reopens its own stream."""
    a, t, m = node(tmp_path / "a"), node(tmp_path / "t"), node(tmp_path / "m")
    try:
        m.connect(a.addrs[0])
        m.connect(t.addrs[0])
        a.connect(t.addrs[0])
        assert delivered(m, a, 1, 20) and delivered(a, m, 1, 20)
        wedge(a, m.peer_id)
        wedge(m, a.peer_id)
        assert delivered(m, a, 2, 10) and delivered(a, m, 2, 10)
        assert counted(a, "pubsub_repaired", 25) >= 1, a.stats()
        assert counted(m, "pubsub_repaired", 10) >= 1, m.stats()
        t.stop()  # only the direct streams are left
        assert delivered(m, a, 3, 10) and delivered(a, m, 3, 10)
    finally:
        for n in (m, t, a):
            n.stop()


@pytest.mark.slow
def test_peer_that_never_takes_our_stream_is_disconnected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b`` stays subscribed on its own stream but refuses ours: ``a`` retries under a timeout,
    then closes every connection to ``b``; once ``b`` dials again, gossip flows."""
    monkeypatch.setattr(liveness, "RETRY_S", 2.0)
    monkeypatch.setattr(liveness, "RESET_S", 8.0)
    a, b = node(tmp_path / "a"), node(tmp_path / "b")
    try:
        b.connect(a.addrs[0])
        assert delivered(a, b, 1, 20)
        protocols = list(b._pubsub.router.get_protocols())

        def refuse() -> None:
            for p in protocols:
                b._host.remove_stream_handler(p)

        b._call_sync(refuse)
        wedge(a, b.peer_id)
        assert counted(a, "stuck_peer_resets", 30) >= 1, a.stats()
        deadline = time.monotonic() + 5
        while any(p.peer_id == b.peer_id and p.connected for p in a.peers()):
            assert time.monotonic() < deadline, "a kept its connections to b"
            time.sleep(0.1)

        def accept() -> None:
            for p in protocols:
                b._host.set_stream_handler(p, b._pubsub.stream_handler)

        b._call_sync(accept)
        b.connect(a.addrs[0])
        assert delivered(a, b, 2, 20), a.stats()
    finally:
        b.stop()
        a.stop()


@pytest.mark.slow
def test_stream_whose_connection_takes_no_bytes_is_cut(tmp_path: Path) -> None:
    """The only connection between ``a`` and ``b`` stops taking bytes: each side's pubsub writer
    blocks with the other still registered (nothing errors, nothing closes). Each side pings the
    connection, closes it, and once ``b`` dials again gossip flows."""
    a, b = node(tmp_path / "a"), node(tmp_path / "b")
    port = int(a.addrs[0].split("/tcp/")[1].split("/")[0])
    relay = StallRelay(port)
    try:
        b.connect(f"/ip4/127.0.0.1/tcp/{relay.port}/p2p/{a.peer_id}")
        assert delivered(a, b, 1, 20) and delivered(b, a, 1, 20)
        relay.stalled.set()
        for n in (a, b):
            for _ in range(3):  # past the stream's 256 KiB flow-control window: the writer waits
                n._publish_raw(HB, os.urandom(300_000))
        deadline = time.monotonic() + 30
        while any(p.connected for n in (a, b) for p in n.peers()):
            assert time.monotonic() < deadline, (a.stats(), b.stats())
            for n in (a, b):
                n.publish(HB, beat(n, 2))  # live traffic keeps the backlog growing
            time.sleep(0.5)
        assert a.stats()["pubsub_unblocked"] >= 1 and b.stats()["pubsub_unblocked"] >= 1
        b.connect(a.addrs[0])
        assert delivered(a, b, 3, 20) and delivered(b, a, 3, 20), (a.stats(), b.stats())
    finally:
        b.stop()
        a.stop()
        relay.close()
