"""Item 5 of docs/SECURITY.md: peers holding chunk-serving slots open must not lock others out."""

import trio

from p2prl.bench.peerproc import blob_bytes
from p2prl.net import chunkproto as cp
from p2prl.net.config import Limits, NetConfig
from p2prl.net.node import P2PNode
from p2prl.protocol.blobs import BlobRef, blob_ref_for

CH = 64 * 1024


def hold_slots(attacker: P2PNode, server: P2PNode, ref: BlobRef, n: int, keepalive_s: float) -> None:
    """Open ``n`` chunk streams to ``server`` and keep each alive with a tiny HAVE every ``keepalive_s``
    (in the attacker's own trio thread, until the attacker stops)."""

    async def one() -> None:
        try:
            stream = await attacker.open_chunk_stream(server.peer_id)
            while True:
                await cp.write_all(stream, cp.encode_request(cp.OP_HAVE, ref.id, ref.digest, 0, CH), 5)
                await cp.read_response(stream, cp.MAX_HAVE_PAYLOAD, 5)
                await trio.sleep(keepalive_s)
        except Exception:
            pass  # refused or evicted

    async def start() -> None:
        assert attacker._nursery is not None
        for _ in range(n):
            attacker._nursery.start_soon(one)
            await trio.sleep(0.01)
        await trio.sleep(1.0)  # every stream opened and asked once

    attacker._call(start)


def setup(make_node, limits: Limits, attackers: int, streams: int):
    server = make_node("server", config=NetConfig(limits=limits))
    data = blob_bytes(5, 6 * CH)
    ref = blob_ref_for(data, CH)
    server.store.put(data)
    server.serve(ref)
    for i in range(attackers):
        a = make_node(f"attacker{i}")
        a.connect(server.addrs[0])
        hold_slots(a, server, ref, streams, keepalive_s=1.0)
    honest = make_node("honest")
    honest.connect(server.addrs[0])
    return server, honest, ref, data


def test_one_peer_cannot_take_every_slot(make_node) -> None:
    server, honest, ref, data = setup(make_node, Limits(max_serving_streams=16), attackers=1, streams=16)
    assert honest.fetch(ref, timeout=5, s3=False).read_bytes() == data
    assert server.stats().get("serve.refused_peer_cap", 0) > 0


def test_idle_slots_are_evicted_for_a_newcomer(make_node) -> None:
    # two peers together fill every slot within their per-peer caps, touching each stream every second
    server, honest, ref, data = setup(make_node, Limits(max_serving_streams=8), attackers=2, streams=4)
    assert honest.fetch(ref, timeout=5, s3=False).read_bytes() == data
    assert server.stats().get("serve.evicted_idle", 0) > 0
