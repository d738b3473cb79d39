"""Gossip between real libp2p hosts on 127.0.0.1: delivery, hostile envelopes, clean shutdown."""

import time

import pytest

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode, PublishError
from p2prl.net.topics import heartbeats_topic, manifests_topic
from p2prl.protocol import Heartbeat, encode_message
from p2prl.store import BlobStore

NET = "testnet"
HB = heartbeats_topic(NET)


def beat(ident: Identity, version: int) -> bytes:
    return encode_message(ident, NET, Heartbeat("miner", version, "p", (), (), {}))


def until_delivered(sender: P2PNode, receiver: P2PNode, version: int, timeout: float = 20.0) -> list:
    """Publish fresh heartbeats (re-announce) until the receiver has one of ``version``."""
    got: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sender.publish(HB, beat(sender.identity, version))
        got += receiver.poll(0.5)
        if any(i.message.version == version for i in got):
            return got
    raise AssertionError(f"version {version} never delivered; receiver stats {receiver.stats()}")


def test_gossip_hostile_envelopes_dropped_and_counted(make_node, assert_no_thread_leak) -> None:
    a, b = make_node("a"), make_node("b")
    b.subscribe(HB)
    a.subscribe(HB)
    b.connect(a.addrs[0])
    got = until_delivered(a, b, 1)
    assert got[0].from_peer == a.peer_id and got[0].envelope.signer == a.identity.public_key

    good = beat(a.identity, 2)
    unsigned = good[:-64] + b"\x00" * 64
    other = Identity.generate()
    pos = 5 + len("heartbeat")
    wrong_signer = good[:pos] + other.public_key + good[pos + 32 :]
    a._publish_raw(HB, good)
    a._publish_raw(HB, good)  # the same envelope again: a replay
    a._publish_raw(HB, b"P2E\x01" + b"\x00" * (600 * 1024))  # oversized (under libp2p's 1 MiB cap)
    a._publish_raw(HB, b"\xff not an envelope")
    a._publish_raw(HB, unsigned)
    a._publish_raw(HB, wrong_signer)
    a._publish_raw(HB, encode_message(a.identity, NET, Heartbeat("trainer", 9, "p", (), (), {}))[:-3])
    with pytest.raises(PublishError):
        a.publish(HB, b"junk")
    with pytest.raises(PublishError):
        a.publish(manifests_topic(NET), beat(a.identity, 5))
    got = until_delivered(a, b, 3)
    versions = [i.message.version for i in got]
    assert versions.count(2) == 1 and 9 not in versions
    s = b.stats()
    assert s["dropped.replayed"] == 1
    assert s["dropped.oversized"] == 1
    assert s["dropped.bad_magic"] == 1
    assert s["dropped.bad_signature"] == 2
    assert s["dropped.truncated"] == 1
    assert s["dropped"] >= 6 and s["bans"] == 0
    assert a.stats()["gossip_out"] >= 9

    a.stop()
    b.stop()
    assert_no_thread_leak()


def test_start_stop_is_idempotent_and_peers_listed(tmp_path) -> None:
    a = P2PNode(Identity.generate(), NET, BlobStore(tmp_path / "a"), NetConfig())
    b = P2PNode(Identity.generate(), NET, BlobStore(tmp_path / "b"), NetConfig(bootstrap=[]))
    with a, b:
        assert a.addrs[0].endswith("/p2p/" + a.peer_id)
        b.connect(a.addrs[0])
        ps = b.peers()
        assert [p.peer_id for p in ps if p.connected] == [a.peer_id]
    a.stop()
    with pytest.raises(RuntimeError):
        a.connect(b.addrs[0])
