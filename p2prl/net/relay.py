"""Circuit relays for peers behind NAT (py-libp2p's circuit relay v2) and hole punching (DCUtR).

Two NATed peers cannot dial each other. A public node that runs the relay service
(``NetConfig.relay``) lets a NATed node reserve a slot; the NATed node then advertises
``<relay addr>/p2p-circuit/p2p/<itself>`` and others reach it through the relay. Every node runs
DCUtR, which upgrades a relayed connection to a direct one where the NATs allow (both sides dial
at once from their listen ports) and closes the relayed leg afterwards.

A relay carries control traffic only: the chunk server refuses streams over relayed connections
and downloads do not recruit peers they reach only through one (a relay carried 11–21 MB/s here
against 75–100 MB/s direct). What a relay carries for others is bounded (``RelayBounds``): slots,
circuits per peer, bytes and seconds per circuit, and bytes per peer per hour.

py-libp2p 0.8.1 needs hand-wiring (docs/NETWORK.md, notes): ``host.connect`` cannot dial
``/p2p-circuit`` addresses, so ``RelayClient.dial`` uses the circuit transport itself; slots are
freed only at their TTL, so the slot count is high and the TTL short; a dial through the
transport would also reserve a slot at the relay unless the client role is off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.constants import MAX_READ_LEN

from p2prl.net.config import RelayBounds
from p2prl.net.conns import is_relayed
from p2prl.net.counters import Counters

log = logging.getLogger(__name__)

MAX_RELAYS = 2  # relays a NATed node keeps a slot at
RESERVE_EVERY_S = 60.0  # a NATed node without enough slots looks for relays this often


class PeerBudget:
    """Bytes relayed per peer in the current hour; bounded in the number of peers it tracks."""

    def __init__(self, per_hour: int, max_peers: int) -> None:
        self.per_hour, self.max_peers = per_hour, max_peers
        self.used: dict[str, tuple[float, int]] = {}  # peer -> (hour started, bytes)
        self.total: dict[str, int] = {}  # peer -> bytes relayed since start (reports)

    def charge(self, peers: tuple[str, ...], n: int, now: float | None = None) -> bool:
        """Count ``n`` bytes against every peer in ``peers``; False (nothing counted) when one of
        them would pass its hourly budget."""
        t = time.monotonic() if now is None else now
        fresh = {}
        for p in peers:
            start, used = self.used.get(p, (t, 0))
            if t - start >= 3600.0:
                start, used = t, 0
            if used + n > self.per_hour:
                return False
            fresh[p] = (start, used + n)
        if len(self.used) + len(fresh) > self.max_peers:
            self.used = {p: v for p, v in self.used.items() if t - v[0] < 3600.0}
            if len(self.used) + len(fresh) > self.max_peers:
                return False
        self.used.update(fresh)
        for p in peers:
            self.total[p] = self.total.get(p, 0) + n
            if len(self.total) > self.max_peers:
                self.total.pop(next(iter(self.total)))
        return True


class BoundedRelay(CircuitV2Protocol):
    """The circuit v2 relay (hop) with a byte budget per peer and counters of what it carried."""

    def __init__(self, host: Any, bounds: RelayBounds, counters: Counters) -> None:
        limits = RelayLimits(
            duration=bounds.circuit_s,
            data=bounds.circuit_bytes,
            max_circuit_conns=bounds.circuits_per_peer,
            max_reservations=bounds.max_reservations,
            reservation_ttl=bounds.reservation_ttl_s,
        )
        super().__init__(host, limits=limits, allow_hop=True)
        self.counters = counters
        self.budget = PeerBudget(bounds.peer_bytes_per_hour, bounds.max_tracked_peers)

    async def _relay_data(  # one direction of a circuit; replaces the library's copy loop
        self,
        src_stream: Any,
        dst_stream: Any,
        peer_id: Any,
        deadline: float | None = None,
        circuit_data_limit: list[int] | None = None,
    ) -> None:
        ends = (str(src_stream.muxed_conn.peer_id), str(dst_stream.muxed_conn.peer_id))
        try:
            while deadline is None or time.monotonic() < deadline:
                data = await src_stream.read(MAX_READ_LEN)
                if not data:
                    break
                n = len(data)
                if circuit_data_limit is not None:
                    if n > circuit_data_limit[0]:
                        self.counters.add("relay.circuit_limit")
                        break
                    circuit_data_limit[0] -= n
                if not self.budget.charge(ends, n):
                    self.counters.add("relay.peer_budget")
                    log.info("relay: hourly budget of %s or %s used up: circuit closed", *ends)
                    break
                with trio.fail_after(self.write_timeout):
                    await dst_stream.write(data)
                self.counters.add("relay.bytes", n)
        except Exception as e:
            log.debug("relaying %s -> %s ended: %r", ends[0][-8:], ends[1][-8:], e)
        finally:
            for s in (src_stream, dst_stream):  # the other direction's read ends with it
                try:
                    await s.reset()
                except Exception:
                    pass

    def carried(self) -> dict[str, int]:
        """Bytes relayed per peer (either end) since the relay started."""
        return dict(self.budget.total)


class RelayClient:
    """Dials through relays, and for a NATed node holds slots at up to ``MAX_RELAYS`` relays."""

    def __init__(self, host: Any, protocol: CircuitV2Protocol, counters: Counters) -> None:
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
        from libp2p.relay.circuit_v2.transport import CircuitV2Transport

        self.host, self.counters = host, counters
        # the STOP role only: with the client role a dial would first reserve a slot at the relay
        self.transport = CircuitV2Transport(host, protocol, RelayConfig(roles=RelayRole.STOP))
        self.relays: dict[str, str] = {}  # relay peer id -> its address we reached it at

    async def dial(self, addr: str, timeout: float) -> None:
        import multiaddr

        with trio.fail_after(timeout):
            await self.transport.dial(multiaddr.Multiaddr(addr))
        self.counters.add("relay.dials")

    async def reserve(self, peer: str, nursery: trio.Nursery, timeout: float) -> bool:
        """Ask ``peer`` for a slot; True when it is a relay and granted one."""
        from libp2p.peer.id import ID

        pid = ID.from_base58(peer)
        try:  # once identify told us its protocols, skip a peer that runs no relay
            protocols = self.host.get_peerstore().get_protocols(pid)
        except Exception:
            protocols = []
        if protocols and HOP_PROTOCOL_ID not in protocols:
            return False
        with trio.move_on_after(timeout):
            try:
                stream = await self.host.new_stream(pid, [HOP_PROTOCOL_ID])
            except Exception as e:  # not a relay (protocol refused) or gone
                log.debug("no relay at %s: %r", peer[-8:], e)
                return False
            try:
                ok = await self.transport.reserve(stream, pid, nursery)
            finally:
                await stream.close()
            if ok:
                addr = _remote_addr(self.host, pid)
                if addr is not None:
                    self.relays[peer] = addr
                    self.counters.add("relay.reservations")
                    log.info("reserved a relay slot at %s (%s)", peer[-8:], addr)
                    return True
        return False

    def circuit_addrs(self, me: str) -> list[str]:
        """Our relayed addresses, for a NATed node to advertise."""
        return [f"{a}/p2p/{r}/p2p-circuit/p2p/{me}" for r, a in self.relays.items()]

    def forget(self, connected: set[str]) -> None:
        """Drop relays we are no longer connected to (their slot is of no use to dialers now)."""
        for r in [r for r in self.relays if r not in connected]:
            del self.relays[r]


def _remote_addr(host: Any, pid: Any) -> str | None:
    """The ``/ip4/…/tcp/…`` we reached ``pid`` at over a direct connection."""
    for conn in host.get_network().get_connections_map().get(pid, []):
        mc = getattr(conn, "muxed_conn", conn)
        if is_relayed(mc):
            continue
        for a in mc.get_transport_addresses() or ():
            s = str(a).split("/p2p/")[0]
            if "/tcp/" in s:
                return s
    return None
