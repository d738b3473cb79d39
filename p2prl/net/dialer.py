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
    is configured as part of a local network (``local_network``; docs/SECURITY.md, item 16)."""

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
    ) -> None:
        self.host = host
        self.stop = stop
        self.on_dialed = on_dialed
        self._want: LRU[str, tuple[float, tuple[str, ...]]] = LRU(4 * self.MAX_PEERS)
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.local = local

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
            now = time.monotonic()
            for peer_id, addrs in todo:
                if self.stop.is_set() or len(connected) >= self.MAX_PEERS:
                    break
                if now - self._tried.get(peer_id, -1e9) < self.RETRY_S:
                    continue
                self._tried[peer_id] = now
                for a in addrs:
                    full = a if "/p2p/" in a else f"{a}/p2p/{peer_id}"
                    try:
                        self.host.connect(full, timeout=5.0)
                        connected.add(peer_id)
                        if self.on_dialed is not None:
                            self.on_dialed()
                        break
                    except Exception as e:
                        log.debug("dial %s failed: %r", full, e)
            while len(self._tried) > 4096:
                self._tried.pop(next(iter(self._tried)))


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
