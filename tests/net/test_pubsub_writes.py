"""Two RPCs written to one peer at once arrive whole, however large.

A node writes to a peer's GossipSub stream from two places (the peer's send queue, and gossipsub's
publish and forward paths). yamux sends an RPC larger than one frame (64 KiB) frame by frame and lets
any other writer in between, so the peer read two RPCs' bytes mixed, could not parse them and struck
the sender: on a SmolLM2 network (whose anchor manifest is such an RPC) a miner banned its honest
trainer and stopped serving it rollouts. Real hosts, real yamux streams, the node's own pubsub.
"""

import time

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

BIG = 200 * 1024  # over three 64 KiB yamux frames
WRITERS = 4


def write_at_once(sender, receiver_id: str) -> None:
    """``WRITERS`` large RPCs written to the receiver's stream by as many concurrent tasks."""
    pubsub = sender._pubsub

    async def go() -> None:
        with trio.fail_after(20):
            while ID.from_base58(receiver_id) not in pubsub.peers:
                await trio.sleep(0.05)
            stream = pubsub.peers[ID.from_base58(receiver_id)]
            async with trio.open_nursery() as n:
                for i in range(WRITERS):
                    msg = rpc_pb2.Message(data=bytes([i]) * BIG, topicIDs=["p2prl-test-writes"])
                    n.start_soon(pubsub.write_msg, stream, rpc_pb2.RPC(publish=[msg]))

    sender._call(go)


def test_concurrent_large_rpcs_are_not_interleaved(make_node) -> None:
    a, b = make_node("a"), make_node("b")
    b.connect(a.addrs[0])
    write_at_once(a, b.peer_id)
    time.sleep(2.0)
    # without one writer at a time per stream, b read mixed bytes here: malformed RPCs, a struck peer
    assert b.stats().get("gossip.malformed_rpc", 0) == 0, b.stats()
    assert a.peer_id in {p.peer_id for p in b.peers() if p.connected and not p.banned}
