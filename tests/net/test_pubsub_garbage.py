"""A peer that writes a malformed RPC on its GossipSub stream must not stop the node's network.

py-libp2p 0.8.1 parses each inbound pubsub RPC with protobuf's ``ParseFromString`` and catches only
stream errors around it: a ``DecodeError`` ends the pubsub service and with it the node's host, so
any peer could silence any node with four bytes."""

import time

import trio

from p2prl.bench.peerproc import blob_bytes
from p2prl.protocol.blobs import blob_ref_for

GARBAGE = b"\xff\xff\xff\xff"  # field 31 with wire type 7: no protobuf parses it


def send_garbage(attacker, victim_id: str) -> None:
    from libp2p.peer.id import ID
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12

    async def go() -> None:
        with trio.fail_after(10):
            stream = await attacker._host.new_stream(ID.from_base58(victim_id), [PROTOCOL_ID_V12])
            await stream.write(bytes([len(GARBAGE)]) + GARBAGE)
            await trio.sleep(0.5)

    attacker._call(go)


def test_a_malformed_pubsub_rpc_leaves_the_node_running(make_node) -> None:
    victim = make_node("victim")
    honest = make_node("honest")
    data = blob_bytes(3, 256 * 1024)
    ref = blob_ref_for(data, 64 * 1024)
    honest.store.put(data)
    honest.serve(ref)
    victim.connect(honest.addrs[0])
    attacker = make_node("attacker")
    attacker.connect(victim.addrs[0])
    send_garbage(attacker, victim.peer_id)
    time.sleep(1.0)
    assert victim.fetch(ref, timeout=10, s3=False).read_bytes() == data  # the host still runs
    assert victim.stats().get("gossip.malformed_rpc", 0) >= 1
