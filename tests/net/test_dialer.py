"""Item 16 of docs/SECURITY.md: the dialer that follows heartbeats. Sybil heartbeats must not fill
its want-list for good, and addresses a heartbeat names are dialled only if global, unless the
node is configured as part of a local network."""

from __future__ import annotations

import threading
import time

import pytest

from p2prl.net.dialer import Dialer


def dialer_for(net, local: bool = False, dialed: list[int] | None = None) -> Dialer:
    count = dialed if dialed is not None else []
    return Dialer(net, threading.Event(), local=local, on_dialed=lambda: count.append(1))


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
