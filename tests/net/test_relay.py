"""Circuit relay between real hosts on loopback: a peer reached only through a relay gets control
traffic but no chunk requests (none asked, and one asked anyway is refused), and a relay stops
carrying for a peer past its byte budget. NATed hosts and hole punching: tests/testbed/test_relay.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from dialbackkit import ask_raw

from p2prl.net import chunkproto as cp
from p2prl.net import dialback
from p2prl.net.config import NetConfig, RelayBounds
from p2prl.net.node import P2PNode
from p2prl.protocol.blobs import MIN_CHUNK_SIZE, blob_ref_for


def _wait(cond: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(cond())


def _relayed_pair(make_node: Callable[..., P2PNode], bounds: RelayBounds) -> tuple[P2PNode, P2PNode, P2PNode]:
    """Relay ``r``; ``b`` holds a slot there; ``a`` dials ``b`` only through ``r`` (no hole punch)."""
    r = make_node("r", config=NetConfig(relay=bounds))
    a = make_node("a", config=NetConfig(hole_punch=False))
    b = make_node("b", config=NetConfig(hole_punch=False))
    a.connect(r.addrs[0])
    b.connect(r.addrs[0])
    assert b._call(b._relay_client.reserve, r.peer_id, b._nursery, 10.0)
    b.reachable = False  # as behind a NAT: advertise the relayed address only
    [circuit] = b.advertised_addrs()
    assert circuit == f"{r.addrs[0]}/p2p-circuit/p2p/{b.peer_id}"
    return r, a, b


async def _ask_have(a: P2PNode, peer: str, blob_id: str, digest: str) -> bytes:
    stream = await a.open_chunk_stream(peer)
    try:
        await stream.write(cp.encode_request(cp.OP_HAVE, blob_id, digest, 0, MIN_CHUNK_SIZE))
        return await stream.read(64)
    except Exception as e:  # refused: the stream is reset
        return repr(e).encode()
    finally:
        await stream.close()


def test_no_chunks_over_a_relayed_connection(make_node: Callable[..., P2PNode]) -> None:
    r, a, b = _relayed_pair(make_node, RelayBounds())
    a.connect(f"{r.addrs[0]}/p2p-circuit/p2p/{b.peer_id}")
    assert a.connections()[b.peer_id] == [True]  # one connection to b, relayed
    data = bytes(range(256)) * 1024
    b.store.put(data)
    ref = blob_ref_for(data, MIN_CHUNK_SIZE)
    b.serve(ref)
    a.add_provider_hint(ref.id, b.peer_id)
    assert b.peer_id not in a.providers(ref.id)  # hinted, but reached only through the relay
    # a peer that asks anyway is refused before a byte of the blob is read
    out = a._call(_ask_have, a, b.peer_id, ref.id, ref.digest)
    assert not out.startswith(bytes([cp.OK])), out
    assert b.stats().get("serve.refused_relayed") == 1
    assert b.stats().get("bytes_up", 0) == 0
    carried = r.relay_stats()["carried"]
    assert carried[a.peer_id] == carried[b.peer_id] > 0  # the relay counts what it carried for whom


def test_no_dial_back_over_a_relayed_connection(make_node: Callable[..., P2PNode]) -> None:
    """Over a relay the helper observes the relay's address: a public node that asked there would be
    told its port is closed and take itself for NATed (it then advertised only relayed addresses)."""
    r, a, b = _relayed_pair(make_node, RelayBounds())
    a.connect(f"{r.addrs[0]}/p2p-circuit/p2p/{b.peer_id}")
    assert a.connections()[b.peer_id] == [True]
    port = int(a.addrs[0].split("/tcp/")[1].split("/")[0])
    out = a._call(ask_raw, a, b.peer_id, dialback.encode_request([port]))
    assert not out.startswith(b"\x09"), out  # no answer naming an observed ip
    assert b.stats().get("dialback.refused_relayed") == 1
    assert b.stats().get("dialback.answered", 0) == 0
    assert _wait(lambda: a.reachable is not None, 15)
    assert a.reachable is True  # asked the relay, its one direct peer


def test_relay_stops_past_a_peers_byte_budget(make_node: Callable[..., P2PNode]) -> None:
    r, a, b = _relayed_pair(make_node, RelayBounds(peer_bytes_per_hour=2000))
    try:
        a.connect(f"{r.addrs[0]}/p2p-circuit/p2p/{b.peer_id}")
    except Exception:
        pass  # the budget may run out inside the handshake already
    assert _wait(lambda: r.stats().get("relay.peer_budget", 0) >= 1, 15)
    assert r.relay_stats()["carried"].get(b.peer_id, 0) <= 2000
    assert _wait(lambda: b.peer_id not in a.connections(), 15)  # the circuit is closed


def _reserve(n: P2PNode, relay: P2PNode) -> bool:
    n.connect(relay.addrs[0])
    return bool(n._call(n._relay_client.reserve, relay.peer_id, n._nursery, 10.0))


@pytest.mark.slow
def test_throwaway_peer_ids_cannot_hold_a_relays_slots(make_node: Callable[..., P2PNode]) -> None:
    """Item 26: throwaway peer ids reserve every slot of a relay (8 here) and leave; an honest NATed
    peer must still get one (the slots stayed held until their 600 s TTL)."""
    r = make_node("r", config=NetConfig(relay=RelayBounds(max_reservations=8)))
    throwaway = [make_node(f"t{i}") for i in range(8)]
    for t in throwaway:
        _reserve(t, r)
    for t in throwaway:
        t.stop()
    honest = make_node("honest")
    assert _wait(lambda: _reserve(honest, r), 15), "an honest peer was refused a slot"


def test_slots_freed_on_disconnect_and_capped_per_address(make_node: Callable[..., P2PNode]) -> None:
    r = make_node("r", config=NetConfig(relay=RelayBounds(max_reservations=8, per_ip=2)))
    a, b, c = (make_node(n) for n in "abc")
    assert _reserve(a, r) and _reserve(b, r)
    assert not _reserve(c, r)  # a third slot from 127.0.0.1
    assert r.stats().get("relay.slot_refused.per_ip") == 1
    a.stop()
    assert _wait(lambda: _reserve(c, r), 15)  # a's slot went with its connection


def test_a_full_relay_makes_room_for_a_peer_with_standing(make_node: Callable[..., P2PNode]) -> None:
    bounds = RelayBounds(max_reservations=2, per_ip=8, per_subnet=8)
    r = make_node("r", config=NetConfig(relay=bounds))
    a, b, c, d = (make_node(n) for n in "abcd")
    assert _reserve(a, r) and _reserve(b, r)
    assert not _reserve(c, r)  # full, and c has no standing
    r.add_standing([d.peer_id])  # seen in verdicts or scores
    assert _reserve(d, r)
    assert r.stats().get("relay.slot_taken_for_standing") == 1
    assert r.stats().get("relay.slot_refused.full") == 1


def test_validators_verdicts_give_standing(make_node: Callable[..., P2PNode]) -> None:
    """The pump hands the relay the peers a genesis validator vouched for: the validator and a miner
    whose batch it accepted (from a real signed Verdict)."""
    import threading
    from types import SimpleNamespace

    from p2prl.bench.arena import delivered
    from p2prl.crypto.keys import Identity
    from p2prl.net import peer_id_for
    from p2prl.node.runtime.pump import Handlers, Pump
    from p2prl.protocol.messages import GroupVerdict, Verdict

    r = make_node("r", config=NetConfig(relay=RelayBounds()))
    validator, miner, junk = Identity.generate(), Identity.generate(), Identity.generate()
    ctx = SimpleNamespace(
        net=r, stop=threading.Event(), config=SimpleNamespace(local_network=True, relay_service=True)
    )
    ctx.status = SimpleNamespace(incr=lambda *a: None)
    pump = Pump(ctx, Handlers(), list, int)  # type: ignore[arg-type]
    for who, ok in ((miner, True), (junk, False)):
        v = Verdict(
            "ab" * 32, who.public_hex, 0, (GroupVerdict(0, ok, "ok" if ok else "fingerprint"),), "cd" * 32
        )
        pump._note_standing(delivered(validator, v))
    standing = set(r._relay.standing)
    assert {peer_id_for(validator), peer_id_for(miner)} <= standing
    assert peer_id_for(junk) not in standing
