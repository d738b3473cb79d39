"""Item 16 of docs/SECURITY.md: the dialer that follows heartbeats. Sybil heartbeats must not fill
its want-list for good, and addresses a heartbeat names are dialled only if global, unless the
node is configured as part of a local network."""

from __future__ import annotations

import threading
import time

import pytest

from p2prl.net.dialer import DialBudget, Dialer


def dialer_for(net, local: bool = False, dialed: list[int] | None = None) -> Dialer:
    count = dialed if dialed is not None else []
    standing = getattr(net, "has_standing", None)
    return Dialer(net, threading.Event(), local=local, on_dialed=lambda: count.append(1), standing=standing)


def run_for(d: Dialer, seconds: float) -> None:
    t = threading.Thread(target=d.run)
    t.start()
    time.sleep(seconds)
    d.stop.set()
    t.join(10)


def connected(a, b) -> bool:
    return any(p.peer_id == b.peer_id and p.connected for p in a.peers())


@pytest.mark.slow
def test_loopback_addresses_dialled_only_on_a_local_network(make_node) -> None:
    me, target = make_node("me"), make_node("target")
    d = dialer_for(me)  # a public network: a heartbeat naming 127.0.0.1 (or 169.254.169.254) is ignored
    d.offer(target.peer_id, (*target.addrs, "/ip4/169.254.169.254/tcp/80"))
    run_for(d, 2.0)
    assert not connected(me, target)
    dialed: list[int] = []
    local = dialer_for(me, local=True, dialed=dialed)
    local.offer(target.peer_id, tuple(target.addrs))
    run_for(local, 2.0)
    assert connected(me, target) and dialed == [1]


def test_want_list_is_an_expiring_lru(make_node) -> None:
    me = make_node("me")
    d = dialer_for(me)
    for i in range(1000):  # Sybil heartbeats, each with a global address (never dialled here)
        d.offer(
            f"sybil{i}",
            (f"/ip4/1.2.{i // 256}.{i % 256}/tcp/4001",),
        )
    honest = "honest"
    d.offer(honest, ("/ip4/8.8.4.4/tcp/4001",))
    assert honest in d.wanted()
    assert len(d.wanted()) <= 4 * Dialer.MAX_PEERS
    d.WANT_TTL_S = 0.2
    time.sleep(0.3)
    assert d.wanted() == []


class RecordingHost:
    """A host whose dials go nowhere (no route to global addresses here): it records each attempt
    and fails it, as a handshake with the wrong peer id would."""

    peer_id = "me"

    def __init__(self) -> None:
        self.dialled: list[str] = []

    def peers(self) -> list:
        return []

    def connect(self, addr: str, timeout: float | None = None) -> None:
        self.dialled.append(addr)
        raise ConnectionRefusedError(addr)


def test_sybil_heartbeats_cannot_aim_dials_at_a_victim() -> None:
    """Item 28: 1,000 throwaway peer ids each name the same global victim (and its neighbours in
    its /24). The node dials the victim's address at most ``PER_IP`` times and its /24 at most
    ``PER_SUBNET`` times per window, whatever the number of ids (one dial per id before)."""
    host = RecordingHost()
    d = Dialer(host, threading.Event())
    for i in range(1000):
        d.offer(f"sybil{i}", ("/ip4/93.184.216.34/tcp/22", f"/ip4/93.184.216.{i % 250 + 1}/tcp/{1 + i}"))
    run_for(d, 3.0)
    to_victim = [a for a in host.dialled if a.startswith("/ip4/93.184.216.34/")]
    assert 1 <= len(to_victim) <= DialBudget.PER_IP
    assert len(host.dialled) <= DialBudget.PER_SUBNET


@pytest.mark.slow
def test_a_flood_of_peer_ids_is_rate_limited_on_a_local_network(make_node) -> None:
    """Item 28: on a local network (addresses shared), 64 throwaway peer ids naming one real listener
    reach it at most ``BURST`` + ``RATE_PER_S`` per second dials (libp2p makes up to 4 connection
    attempts a dial); a peer with standing is dialled first, whatever the flood."""
    import socket

    from p2prl.crypto.keys import Identity
    from p2prl.net import peer_id_for

    victim = socket.create_server(("127.0.0.1", 0))
    victim.settimeout(0.2)
    port = victim.getsockname()[1]
    hits: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = victim.accept()
                hits.append(1)
                c.close()
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    me, target = make_node("me"), make_node("target")
    me.add_standing([target.peer_id])  # seen in verdicts or scores
    d = dialer_for(me, local=True)
    try:
        d.offer(target.peer_id, tuple(target.addrs))
        for _ in range(64):
            d.offer(peer_id_for(Identity.generate()), (f"/ip4/127.0.0.1/tcp/{port}",))
        t0 = time.monotonic()
        run_for(d, 4.0)
        secs = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
        victim.close()
    assert connected(me, target)
    assert len(hits) <= 4 * (DialBudget.BURST + DialBudget.RATE_PER_S * secs + 1), len(hits)
