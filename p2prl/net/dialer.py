"""The dialer: connects to the peers heartbeats name, bounded in peers and rate."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from p2prl.lru import LRU

log = logging.getLogger(__name__)


class DialHost(Protocol):
    """What the dialer needs of a host: who it is, whom it is connected to, and a way to dial."""

    peer_id: str

    def peers(self) -> list[Any]:
        """Known peers, each with ``peer_id`` and ``connected``."""
        ...

    def connect(self, addr: str, timeout: float | None = None) -> None:
        """Dial ``addr`` (a multiaddr ending in /p2p/<peer id>); raises when it fails."""


class Dialer:
    """Connects to peers learned from heartbeats, so chunks flow directly between any two nodes
    (gossip alone would only connect each node to its bootstrap peers). Bounded in peers and rate.

    The want-list is an LRU whose entries expire after ``WANT_TTL_S`` without a fresh heartbeat, so
    Sybil heartbeats cannot fill it and lock real peers out; addresses that are not global
    (loopback, private, link-local such as cloud metadata services) are dialled only when the node
    is configured as part of a local network (``local_network``; docs/SECURITY.md, item 16).

    Heartbeats are free to sign under any number of peer ids, each naming any address, so every
    dial attempt passes ``DialBudget`` (item 28): a flood cannot turn the node into a reflector or a
    scanner aimed at someone else's host; peers with standing (seen in verdicts or scores,
    ``standing``) are dialled first, so a flood of fresh peer ids does not spend the budget before them."""

    MAX_PEERS = 32
    RETRY_S = 30.0
    WANT_TTL_S = 120.0

    def __init__(
        self,
        host: DialHost,
        stop: threading.Event,
        *,
        local: bool = False,
        on_dialed: Callable[[], None] | None = None,
        standing: Callable[[str], bool] | None = None,
    ) -> None:
        self.host = host
        self.standing = standing or (lambda _p: False)
        self.stop = stop
        self.on_dialed = on_dialed
        self._want: LRU[str, tuple[float, tuple[str, ...]]] = LRU(4 * self.MAX_PEERS)
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.local = local
        self.budget = DialBudget(local)

    def offer(self, peer_id: str, addrs: tuple[str, ...]) -> None:
        if peer_id == self.host.peer_id:
            return
        usable = tuple(a for a in addrs if _dialable(a, self.local))[:4]
        if not usable:
            return
        now = time.monotonic()
        with self._lock:
            self._want.put(peer_id, (now, usable))
            self._expire(now)
        self._wake.set()

    def wanted(self) -> list[str]:
        with self._lock:
            self._expire(time.monotonic())
            return list(self._want)

    def _expire(self, now: float) -> None:
        while self._want and now - next(iter(self._want.values()))[0] > self.WANT_TTL_S:
            self._want.popitem(last=False)

    def run(self) -> None:
        while not self.stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                connected = {p.peer_id for p in self.host.peers() if p.connected}
            except Exception:
                continue
            with self._lock:
                self._expire(time.monotonic())
                todo = [(p, a) for p, (_, a) in reversed(self._want.items()) if p not in connected]
            todo.sort(key=lambda pa: not self.standing(pa[0]))  # peers with standing first (stable)
            now = time.monotonic()
            for peer_id, addrs in todo:
                if self.stop.is_set() or len(connected) >= self.MAX_PEERS:
                    break
                if now - self._tried.get(peer_id, -1e9) < self.RETRY_S:
                    continue
                self._tried[peer_id] = now
                for a in addrs:
                    if not self.budget.allow(a, peer_id, time.monotonic()):
                        continue
                    full = a if "/p2p/" in a else f"{a}/p2p/{peer_id}"
                    try:
                        self.host.connect(full, timeout=5.0)
                        self.budget.answered(a, peer_id)
                        connected.add(peer_id)
                        if self.on_dialed is not None:
                            self.on_dialed()
                        break
                    except Exception as e:
                        log.debug("dial %s failed: %r", full, e)
            while len(self._tried) > 4096:
                self._tried.pop(next(iter(self._tried)))


class DialBudget:
    """How often heartbeat addresses may be dialled, whatever the number of peer ids naming them:
    one attempt per address (IP and port) and peer id per ``TARGET_S`` (``LOCAL_TARGET_S`` on a local
    network) unless the peer answered there; per ``TARGET_S`` at most ``PER_IP`` attempts to one IP address
    and ``PER_SUBNET`` to one /24 (IPv6: /48), except on a local network, where every node shares a
    few addresses; and ``RATE_PER_S`` attempts a second in all (``BURST`` at once). A victim named
    by a thousand heartbeats hears from this node once per ``TARGET_S``."""

    TARGET_S = 300.0
    LOCAL_TARGET_S = 30.0
    PER_IP = 8
    PER_SUBNET = 16
    RATE_PER_S = 0.5
    BURST = 16.0
    MAX_TRACKED = 4096

    def __init__(self, local: bool = False) -> None:
        self.local = local
        self.window = self.LOCAL_TARGET_S if local else self.TARGET_S
        self._tokens = self.BURST
        self._t = time.monotonic()
        self._tried: dict[tuple[str, str, str], float] = {}  # (ip, port, peer id) -> last attempt
        self.refused = 0

    def allow(self, addr: str, peer_id: str, now: float) -> bool:
        """Whether ``addr`` (a multiaddr ``/ip4|ip6|dns*/HOST/tcp/PORT…``) may be dialled for
        ``peer_id`` now; if so, the attempt is counted."""
        target = (*_target(addr), peer_id)
        self._tokens = min(self.BURST, self._tokens + (now - self._t) * self.RATE_PER_S)
        self._t = now
        while self._tried and now - next(iter(self._tried.values())) > self.window:
            self._tried.pop(next(iter(self._tried)))
        ok = self._tokens >= 1.0 and target not in self._tried
        if ok and not self.local:
            ip, net = target[0], subnet_of(target[0])
            ok = sum(1 for t in self._tried if t[0] == ip) < self.PER_IP and (
                sum(1 for t in self._tried if subnet_of(t[0]) == net) < self.PER_SUBNET
            )
        if not ok:
            self.refused += 1
            return False
        self._tokens -= 1.0
        self._tried[target] = now
        while len(self._tried) > self.MAX_TRACKED:
            self._tried.pop(next(iter(self._tried)))
        return True

    def answered(self, addr: str, peer_id: str) -> None:
        """The peer answered at ``addr`` (the handshake named it): no reflection; it may be dialled
        again when it is lost, and it does not count against its address."""
        self._tried.pop((*_target(addr), peer_id), None)


def _target(addr: str) -> tuple[str, str]:
    """(host, port) of a multiaddr ``/ip4|ip6|dns*/HOST/tcp/PORT…``."""
    parts = addr.split("/")
    return (parts[2], parts[4] if len(parts) > 4 else "") if len(parts) > 2 else (addr, "")


def subnet_of(ip: str) -> str:
    """The /24 (IPv4) or /48 (IPv6) an address is in; the address itself when it is none."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    return str(ipaddress.ip_network(f"{ip}/{24 if addr.version == 4 else 48}", strict=False))


def _dialable(addr: str, local: bool = False) -> bool:
    """A TCP multiaddr worth dialling: an IP address that is global (any IP when ``local``); a DNS
    name only when ``local`` (what it resolves to is not ours to check)."""
    if not isinstance(addr, str) or len(addr) > 256:
        return False
    parts = addr.split("/")
    if len(parts) < 3 or parts[0] != "":
        return False
    proto, host = parts[1], parts[2]
    if proto.startswith("dns"):
        return local
    if proto not in ("ip4", "ip6"):
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.is_unspecified or ip.is_multicast:
        return False
    return local or ip.is_global
