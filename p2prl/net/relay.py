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

Slots go by ``SlotPolicy``, since peer ids cost nothing: a slot is freed as soon as its peer is
no longer connected (the library kept it to its TTL, so throwaway ids could take every slot and
leave), one IP address holds at most ``per_ip`` and one /24 at most ``per_subnet``, a full relay
makes room for a peer with standing (seen in verdicts or scores) by dropping a slot of one without,
and the TTL is short (holders refresh every ``REFRESH_S``). A reservation is made only for the peer
that asks, never for a peer id it names.

py-libp2p 0.8.1 needs hand-wiring (docs/NETWORK.md, notes): ``host.connect`` cannot dial
``/p2p-circuit`` addresses, so ``RelayClient.dial`` uses the circuit transport itself; a dial
through the transport would also reserve a slot at the relay unless the client role is off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.constants import MAX_READ_LEN

from p2prl.net.config import RelayBounds
from p2prl.net.conns import is_relayed
from p2prl.net.counters import Counters
from p2prl.net.dialer import subnet_of

log = logging.getLogger(__name__)

MAX_RELAYS = 2  # relays a NATed node keeps a slot at
RESERVE_EVERY_S = 60.0  # a NATed node without enough slots looks for relays this often
REFRESH_S = 40.0  # a NATed node renews its slots this often (a third of the relay's default TTL)


class SlotPolicy:
    """Which peer may hold a relay slot (see the module docstring); ``held`` maps each slot's peer to
    the address it reserved from, in the order they were granted."""

    def __init__(self, bounds: RelayBounds, standing: Callable[[str], bool]) -> None:
        self.bounds = bounds
        self.standing = standing
        self.held: dict[str, str] = {}

    def admit(self, peer: str, ip: str) -> tuple[str | None, str | None]:
        """(refusal reason or None, the peer whose slot goes to make room or None) for a new slot."""
        if peer in self.held:
            return None, None
        if sum(1 for a in self.held.values() if a == ip) >= self.bounds.per_ip:
            return "per_ip", None
        net = subnet_of(ip)
        if sum(1 for a in self.held.values() if subnet_of(a) == net) >= self.bounds.per_subnet:
            return "per_subnet", None
        if len(self.held) < self.bounds.max_reservations:
            return None, None
        if self.standing(peer):
            victim = next((p for p in self.held if not self.standing(p)), None)
            if victim is not None:
                return None, victim
        return "full", None


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

    def __init__(
        self, host: Any, bounds: RelayBounds, counters: Counters, standing: dict[str, None] | None = None
    ) -> None:
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
        # peer ids seen in verdicts or scores (P2PNode.add_standing), shared with the host
        self.standing: dict[str, None] = {} if standing is None else standing
        self.slots = SlotPolicy(bounds, self.standing.__contains__)

    def _sweep(self) -> None:
        """Free the slots whose peer left or whose TTL ran out (the library waited for the TTL)."""
        rm = self.resource_manager
        for pid in list(rm._reservations):
            if rm._reservations[pid].is_expired() or not rm._is_peer_connected(pid):
                del rm._reservations[pid]
        live = {str(pid) for pid in rm._reservations}
        for peer in [p for p in self.slots.held if p not in live]:
            del self.slots.held[peer]

    async def _handle_reserve(self, stream: Any, msg: Any) -> None:
        """Grant, refresh or refuse a slot under ``SlotPolicy``; then the library's reply."""
        from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
        from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
        from libp2p.relay.circuit_v2.utils import write_delimited_msg

        conn = stream.muxed_conn
        pid = conn.peer_id
        peer = str(pid)
        self._sweep()
        why: str | None = None
        if msg.HasField("peer") and msg.peer.id and msg.peer.id != pid.to_bytes():
            why = "other_peer"
        else:
            why, victim = self.slots.admit(peer, _remote_ip(conn))
            if victim is not None:
                rm = self.resource_manager
                for v in [v for v in rm._reservations if str(v) == victim]:
                    del rm._reservations[v]
                del self.slots.held[victim]
                self.counters.add("relay.slot_taken_for_standing")
        if why is not None:
            self.counters.add(f"relay.slot_refused.{why}")
            log.info("relay: slot refused to %s (%s)", peer[-8:], why)
            status = HopMessage(
                type=HopMessage.STATUS, status=to_proto_status(StatusCode.RESOURCE_LIMIT_EXCEEDED)
            )
            with trio.move_on_after(self.write_timeout):
                await write_delimited_msg(stream, status)
            return
        self.slots.held.setdefault(peer, _remote_ip(conn))
        await super()._handle_reserve(stream, msg)
        if self.resource_manager.get_reservation(pid) is None:
            self.slots.held.pop(peer, None)

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


def _remote_ip(conn: Any) -> str:
    """The IP address a connection came from ("" when unknown)."""
    try:
        remote = conn.get_remote_address()
        if remote:
            return str(remote[0])
        for a in conn.get_transport_addresses() or ():
            parts = str(a).split("/")
            if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
                return parts[2]
    except Exception:
        pass
    return ""


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
