"""Item 17 of docs/SECURITY.md: an integer past Python's 4,300-digit conversion limit in a signed
body is a malformed-message strike with a reason code, never an internal error."""

import logging
import struct
import time

from p2prl.crypto.envelope import DOMAIN, MAGIC
from p2prl.net.config import Limits, NetConfig
from p2prl.net.topics import heartbeats_topic
from p2prl.protocol import Heartbeat, encode_message

NET = "testnet"
HB = heartbeats_topic(NET)


def signed_body(ident, body: bytes, type_: bytes = b"heartbeat") -> bytes:
    """A correctly signed envelope around raw body bytes (a hostile peer signs whatever it likes)."""
    msg = DOMAIN + bytes([len(NET)]) + NET.encode() + bytes([len(type_)]) + type_ + body
    head = MAGIC + bytes([len(type_)]) + type_ + ident.public_key + struct.pack(">I", len(body))
    return head + body + ident.sign(msg)


def test_huge_integer_is_a_strike_not_a_traceback(make_node, caplog) -> None:
    a = make_node("a")
    b = make_node("b", config=NetConfig(limits=Limits(max_invalid_per_peer=3)))
    a.subscribe(HB)
    b.subscribe(HB)
    b.connect(a.addrs[0])
    deadline = time.monotonic() + 20
    while not b.poll(0.5) and time.monotonic() < deadline:  # until the mesh carries a valid beat
        a.publish(HB, encode_message(a.identity, NET, Heartbeat("miner", 1, "p", (), (), {})))
    caplog.set_level(logging.WARNING, logger="p2prl.net.gossip")
    for i in range(3):
        env = signed_body(a.identity, b'{"version":' + b"9" * 5000 + str(i).encode() + b"}")
        a._call(a._pubsub.publish, HB, env)  # straight to libp2p: the attacker skips its own checks
    deadline = time.monotonic() + 20
    while not b.is_banned(a.peer_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    s = b.stats()
    assert s.get("dropped.internal", 0) == 0
    assert s.get("dropped.bad_body", 0) == 3
    assert b.is_banned(a.peer_id)
    assert "Traceback" not in caplog.text and "gossip check failed" not in caplog.text
