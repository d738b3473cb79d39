"""A peer that restarts with the same key gets gossip and serves chunks again, right away.

Two ways a peer goes away: a clean stop (its connections close; the other side forgets it), and
vanishing without a word (a half-open connection, played by a TCP relay that goes silent). In
both, the peer comes back with the same peer id and must be reached by gossip and chunk requests.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tcprelay import TcpRelay

from p2prl.bench.peerproc import blob_bytes
from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.net.topics import heartbeats_topic
from p2prl.protocol import Heartbeat, encode_message
from p2prl.protocol.blobs import blob_ref_for
from p2prl.store import BlobStore

NET = "testnet"
HB = heartbeats_topic(NET)


class SilentRelay(TcpRelay):
    """A relay that can go silent: it then swallows bytes and never closes a side, as a crashed host
    or a NAT that forgot the flow would (the far end sees a live connection)."""

    def __init__(self, target_port: int) -> None:
        self.silent = threading.Event()
        super().__init__(target_port)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            if self.silent.is_set():
                if not data:
                    self.closed.wait()  # keep the other side open: no FIN, no RST
                    return
                continue
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return


def beat(ident: Identity, version: int) -> bytes:
    return encode_message(ident, NET, Heartbeat("trainer", version, "p", (), (), {}))


def delivered(sender: P2PNode, receiver: P2PNode, version: int, timeout: float) -> bool:
    """Publish fresh heartbeats until the receiver has one of ``version`` (False after timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sender.publish(HB, beat(sender.identity, version))
        if any(i.message.version == version for i in receiver.poll(0.5)):
            return True
    return False


def node(ident: Identity, root: Path) -> P2PNode:
    n = P2PNode(ident, NET, BlobStore(root), NetConfig())
    n.start()
    n.subscribe(HB)
    return n


def check_chunks_both_ways(a: P2PNode, b: P2PNode, seed: int) -> None:
    """``a`` fetches a blob only ``b`` holds, then ``b`` one only ``a`` holds."""
    for src, dst, s in ((b, a, seed), (a, b, seed + 1)):
        data = blob_bytes(s, 300_000)
        ref = blob_ref_for(data, 64 * 1024)
        src.store.put(data)
        dst.add_provider_hint(ref.id, src.peer_id)
        assert hashlib.sha256(dst.fetch(ref, timeout=30).read_bytes()).hexdigest() == ref.id


def restarted_cleanly(tmp_path: Path, check: Callable[[P2PNode, P2PNode], None], published: int = 0) -> None:
    """``b`` connects to ``a``, publishes ``published`` heartbeats, stops cleanly and starts again
    with the same key; ``check(a, b2)`` then."""
    ib = Identity.generate()
    a = node(Identity.generate(), tmp_path / "a")
    b = b2 = None
    try:
        b = node(ib, tmp_path / "b")
        b.connect(a.addrs[0])
        assert delivered(a, b, 1, 20) and delivered(b, a, 1, 20)
        for _ in range(published):
            b.publish(HB, beat(ib, 1))
        time.sleep(1.0 if published else 0.0)
        b.stop()
        b2 = node(ib, tmp_path / "b2")  # same key, so the same peer id
        assert b2.peer_id == b.peer_id
        b2.connect(a.addrs[0])
        check(a, b2)
    finally:
        for n in (b2, b, a):
            if n is not None:
                n.stop()


def test_peer_restarted_after_clean_stop(tmp_path: Path) -> None:
    def check(a: P2PNode, b2: P2PNode) -> None:
        assert delivered(a, b2, 2, 10), (a.stats(), b2.stats())
        check_chunks_both_ways(a, b2, 31)

    restarted_cleanly(tmp_path, check)


@pytest.mark.slow
def test_peer_restarted_after_vanishing(tmp_path: Path) -> None:
    """The old connection stays half-open on ``a``'s side: ``a`` must notice and use the new one."""
    ib = Identity.generate()
    a = node(Identity.generate(), tmp_path / "a")
    port = int(a.addrs[0].split("/tcp/")[1].split("/")[0])
    relay = SilentRelay(port)
    b = b2 = None
    try:
        b = node(ib, tmp_path / "b")
        b.connect(f"/ip4/127.0.0.1/tcp/{relay.port}/p2p/{a.peer_id}")
        assert delivered(a, b, 1, 20)
        relay.silent.set()
        b.stop()
        assert any(p.peer_id == b.peer_id and p.connected for p in a.peers())  # a sees no change
        b2 = node(ib, tmp_path / "b2")
        b2.connect(a.addrs[0])
        assert delivered(a, b2, 2, 15), (a.stats(), b2.stats())
        assert a.stats()["dead_conns_closed"] >= 1
        check_chunks_both_ways(a, b2, 41)
    finally:
        for n in (b2, b, a):
            if n is not None:
                n.stop()
        relay.close()



def test_a_restarted_peers_own_gossip_is_not_taken_for_what_it_sent_before(tmp_path: Path) -> None:
    """Gossip ids are (origin, sequence number). A busy peer (a trainer: manifests, receipts,
    heartbeats) runs its sequence numbers ahead of the clock; started again, it must not reuse the
    numbers of its last run, which its peers still hold as seen for two minutes and would drop."""

    def check(a: P2PNode, b2: P2PNode) -> None:
        assert delivered(b2, a, 2, 10), (a.stats(), b2.stats())

    restarted_cleanly(tmp_path, check, published=300)  # a busy run: far more messages than seconds
