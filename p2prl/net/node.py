"""P2PNode: the synchronous, thread-safe face of the libp2p host (trio never leaves this module).

The host (TCP + Noise + Yamux, GossipSub, the chunk protocol) runs in its own thread under
``trio.run``; node code calls plain methods from any thread, which hop onto the trio thread with
``trio.from_thread``. Incoming gossip is checked by ``GossipFilter`` inside libp2p's validator
hook (so invalid messages are neither delivered nor forwarded) and queued for ``poll``.

py-libp2p 0.8.1 quirks handled here (docs/NETWORK.md): its per-topic rate limit (10/s, own
publishes included) is raised and replaced by our per-peer buckets; subscription buffers are
drained at once; our publishes are paced because its 32-deep peer queues drop silently; each
Pubsub leaks a sweeper thread unless ``seen_messages.stop()`` is called; exceptions inside stream
handlers vanish, so handlers catch and log everything.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from p2prl.crypto import EnvelopeError, Identity
from p2prl.net import chunkproto as cp
from p2prl.net import dialback
from p2prl.net.bans import BanList
from p2prl.net.config import NetConfig
from p2prl.net.conns import close_relayed_beside_direct, direct_peers, is_relayed
from p2prl.net.counters import Counters
from p2prl.net.gossip import GossipFilter, Incoming
from p2prl.net.identity import libp2p_key_pair, peer_id_for
from p2prl.net.liveness import ConnectionWatch
from p2prl.net.partial import PartialStore
from p2prl.net.refs import RefBook
from p2prl.net.s3 import S3Mirror
from p2prl.net.selection import provider_order
from p2prl.net.swarm import ChunkServer, Download, FetchError
from p2prl.net.topics import TOPIC_TYPES, kind_of
from p2prl.protocol import BlobRef, MessageError, decode_message
from p2prl.reasons import GossipDrop, InputReason
from p2prl.store import BlobStore

log = logging.getLogger(__name__)
STANDING_MAX = 4096  # peers with standing a relay remembers (add_standing)
BOOTSTRAP_BACKOFF_S = (1.0, 60.0)  # first and longest wait before dialing a failed bootstrap peer again
INVALID_ADDRESS = "not a valid address"  # a bootstrap address no retry can make dialable

__all__ = ["FetchError", "Incoming", "P2PNode", "PeerInfo", "PublishError"]


class PublishError(ValueError):
    """We refused to publish an envelope that peers would drop (too big, invalid, wrong topic)."""


@dataclass(frozen=True)
class PeerInfo:
    peer_id: str
    addrs: tuple[str, ...]
    connected: bool
    banned: bool


def _libp2p_logging() -> None:
    """libp2p logs each failed stream or dial as a multi-line error through Python's last-resort
    handler (unformatted, on stderr), while this node handles, counts and retries those failures
    itself: keep them out of the log unless it runs at DEBUG, then in the node's own format. Runs
    after libp2p's import, which resets its logger to WARNING; a level set otherwise is kept."""
    lg = logging.getLogger("libp2p")
    if lg.level != logging.WARNING:
        return
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        lg.setLevel(logging.DEBUG)
        lg.propagate = True
    else:
        lg.setLevel(logging.CRITICAL)

class P2PNode:
    def __init__(
        self,
        identity: Identity,
        network_id: str,
        store: BlobStore,
        config: NetConfig | None = None,
        *,
        server_class: type[ChunkServer] = ChunkServer,
    ) -> None:
        """``server_class`` answers the chunk protocol; a subclass may change what is served (the
        fan-out benchmark's corrupt and slow peers override ``ChunkServer.answer``)."""
        self.identity = identity
        self.network_id = network_id
        self.store = store
        self.config = config or NetConfig()
        self.peer_id = peer_id_for(identity)
        self.addrs: list[str] = []
        self.counters = Counters()
        self.partials = PartialStore(store, self.config.limits.max_partial_bytes)
        self.s3: Any = None
        if self.config.s3 is not None:
            self.s3 = S3Mirror(self.config.s3, network_id)
        self._incoming: collections.deque[Incoming] = collections.deque()
        self._cond = threading.Condition()
        self._hints: dict[str, list[str]] = {}
        self._topics: set[str] = set()
        self._banned = BanList(self.config.limits.ban_s)
        self.refs = RefBook(store)
        self._downloads: dict[str, tuple[trio.Event, list[BaseException]]] = {}
        self._filter = GossipFilter(
            network_id,
            self.config.limits,
            self.counters,
            self._deliver,
            self.ban,
            self.config.allowed_signers,
        )
        self._filter.banned = self._banned  # type: ignore[assignment]
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._host: Any = None
        self._pubsub: Any = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._pub_send: Any = None
        self._server_class = server_class
        self._server: ChunkServer | None = None
        self.reachable: bool | None = None  # learned by dial-back; None until a peer answered
        self._public_addrs: list[str] = []
        self._foreign: set[str] = set()  # bootstrap peers already reported as of another network
        self._relay: Any = None  # BoundedRelay when this node relays for others (config.relay)
        self._standing: dict[str, None] = {}  # peers seen in verdicts or scores, oldest first
        self._relay_client: Any = None

    # ---------------------------------------------------------------- lifecycle (any thread)

    def start(self, timeout: float = 30.0) -> None:
        """Start the host thread; returns once it listens (raises if it could not)."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(
            target=self._thread_main, name=f"p2prl-net-{self.peer_id[-6:]}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("network host did not start in time")
        if self._error is not None:
            self._thread.join(5)
            raise RuntimeError(f"network host failed to start: {self._error!r}") from self._error

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the host down and join its thread; idempotent."""
        if self._thread is None:
            return
        if self._token is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._request_stop, trio_token=self._token)
            except (trio.RunFinishedError, RuntimeError):
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("network thread did not stop within %.0f s", timeout)
        self._thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> P2PNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:
            if not self._ready.is_set():
                self._error = e
            else:
                log.exception("network thread crashed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        import multiaddr
        from libp2p import new_host
        from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.tools.anyio_service import background_trio_service

        _libp2p_logging()
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        cfg = self.config
        host = new_host(
            key_pair=libp2p_key_pair(self.identity),
            listen_addrs=[multiaddr.Multiaddr(cfg.listen)],
            enable_mDNS=cfg.mdns,
        )
        router = GossipSub(
            protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID],
            degree=cfg.gossip_degree,
            degree_low=max(1, cfg.gossip_degree - 2),
            degree_high=cfg.gossip_degree * 2,
            heartbeat_interval=cfg.gossip_heartbeat_s,
            max_messages_per_topic_per_second=cfg.limits.topic_msgs_per_s,
            eclipse_protection_enabled=False,  # needs >= 3 distinct IPs in a mesh: not on a LAN or loopback
        )
        pubsub = _guarded(Pubsub)(host, router, strict_signing=True)
        # gossip ids are (origin, sequence number), and py-libp2p starts the numbers at the clock's
        # seconds: a busy node (a trainer) runs ahead of that, and started again it would reuse
        # numbers its peers still hold as seen (two minutes) and drop its news silently. Start at
        # the clock's nanoseconds, as go-libp2p does.
        pubsub.counter = time.time_ns()
        pubsub.on_bad_rpc = self._bad_rpc
        self._host, self._pubsub = host, pubsub
        self._server = self._server_class(self, self.store, self.partials, self.refs)
        watch = ConnectionWatch(host, pubsub, self.counters)
        host.get_network().register_notifee(watch)
        host.set_stream_handler(cp.PROTOCOL_ID, self._server.handle)
        host.set_stream_handler(dialback.PROTOCOL_ID, dialback.DialBackServer(self.counters).handle)
        circuit, dcutr = self._relay_services(host)
        pub_send, pub_recv = trio.open_memory_channel[tuple[str, bytes]](cfg.limits.publish_queue)
        self._pub_send = pub_send
        try:
            async with (
                host.run(listen_addrs=[multiaddr.Multiaddr(cfg.listen)]),
                background_trio_service(pubsub),
                background_trio_service(router),
                background_trio_service(circuit),
                background_trio_service(dcutr) if dcutr is not None else _nothing(),
            ):
                await pubsub.wait_until_ready()
                self.addrs = [str(a) for a in host.get_addrs()]
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._publisher, pub_recv)
                    nursery.start_soon(watch.run)
                    nursery.start_soon(watch.sweep_loop)
                    for t in list(self._topics):
                        await self._subscribe(t)
                    nursery.start_soon(self._bootstrap_loop)
                    nursery.start_soon(self._unban_loop)
                    nursery.start_soon(self._reachability_loop)
                    nursery.start_soon(self._relay_loop)
                    self._ready.set()
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
                await self._close_host(host)
        finally:
            self._nursery = None
            pubsub.seen_messages.stop()  # its sweeper thread outlives the host otherwise
            log.debug("network host %s stopped", self.peer_id[-8:])

    def _relay_services(self, host: Any) -> tuple[Any, Any]:
        """The circuit relay protocol (hop for a relay node, stop for everyone: a NATed node accepts
        relayed connections), its dialing client, and DCUtR."""
        from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
        from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

        from p2prl.net.relay import BoundedRelay, RelayClient

        if self.config.relay is not None:
            self._relay = circuit = BoundedRelay(host, self.config.relay, self.counters, self._standing)
        else:
            circuit = CircuitV2Protocol(host, allow_hop=False)
        self._relay_client = RelayClient(host, circuit, self.counters)
        # dial_timeout 2 s: the default 10 s is spent first on the peer's private address
        dcutr = DCUtRProtocol(host, dial_timeout=2) if self.config.hole_punch else None
        return circuit, dcutr

    async def _close_host(self, host: Any) -> None:
        # leaving host.run() does not close live connections: their sockets would stay open, and a
        # peer would keep writing gossip into a dead host (and ignore us when we come back with
        # the same peer id). Closing them sends FIN, so peers drop our stream state at once.
        async def close(conn: Any) -> None:
            try:
                await conn.close()
            except Exception as e:
                log.debug("closing a connection: %r", e)

        with trio.move_on_after(5.0) as scope:
            async with trio.open_nursery() as nursery:  # each close waits 0.1 s inside libp2p
                for conns in list(host.get_network().get_connections_map().values()):
                    for conn in list(conns):
                        nursery.start_soon(close, conn)
            try:
                await host.close()
            except Exception as e:
                log.debug("closing host: %r", e)
        if scope.cancelled_caught:
            log.warning("closing the network host's connections timed out")

    def running(self) -> bool:
        """The host's thread is alive (False before start, after stop, or after a crash)."""
        return self._token is not None and self._thread is not None and self._thread.is_alive()

    def _call(self, afn: Any, *args: Any) -> Any:
        if self._token is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("network node is not running")
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def _call_sync(self, fn: Any, *args: Any) -> Any:
        if self._token is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("network node is not running")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    # ---------------------------------------------------------------- peers

    def connect(self, addr: str, timeout: float | None = None) -> None:
        """Dial a full multiaddr (…/p2p/<peer id>); raises on failure."""
        self._call(self._connect, addr, timeout or self.config.stream_timeout_s)

    def dial_problem(self, addr: str) -> str | None:
        """Dial ``addr`` as a bootstrap peer is dialled: None once connected, else what is wrong, in
        words a user can act on (``p2prl peers``)."""
        return self._call(self._try_bootstrap, addr)  # type: ignore[no-any-return]

    async def _connect(self, addr: str, timeout: float) -> None:
        import multiaddr
        from libp2p.peer.peerinfo import info_from_p2p_addr

        if "/p2p-circuit/" in addr:  # libp2p's own dialer drops circuit addresses
            if addr.rsplit("/p2p/", 1)[-1] != self.peer_id:
                await self._relay_client.dial(addr, timeout)
            return
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        if info.peer_id.to_base58() == self.peer_id:
            return
        with trio.fail_after(timeout):
            await self._host.connect(info)

    async def _bootstrap_loop(self) -> None:
        """Keep the bootstrap peers connected. A failing one is retried with exponential backoff
        (``BOOTSTRAP_BACKOFF_S``) and logged with what is wrong and what to check; a connected one
        that gossips only another network's topics is reported once."""
        retry_at = dict.fromkeys(self.config.bootstrap, 0.0)
        delay = dict.fromkeys(self.config.bootstrap, BOOTSTRAP_BACKOFF_S[0])
        since: dict[str, float] = {}
        invalid: set[str] = set()  # reported once, never retried: no retry can make it valid
        while True:
            now = trio.current_time()
            for addr in self.config.bootstrap:
                if addr in invalid:
                    continue
                pid = addr.rsplit("/p2p/", 1)[-1]
                if pid in self._connected_ids():
                    delay[addr] = BOOTSTRAP_BACKOFF_S[0]
                    if now - since.setdefault(addr, now) > 5.0:  # subscriptions are exchanged by then
                        self._check_network_of(addr, pid)
                    continue
                since.pop(addr, None)
                if retry_at[addr] > now:
                    continue
                problem = await self._try_bootstrap(addr)
                if problem is None:
                    log.info("connected to bootstrap peer %s", addr)
                    continue
                self.counters.add("bootstrap_failures")
                if problem.startswith(INVALID_ADDRESS):
                    invalid.add(addr)
                    log.warning("bootstrap peer %s: %s; skipped", addr, problem)
                    continue
                log.warning("bootstrap peer %s: %s; retrying in %.0f s", addr, problem, delay[addr])
                retry_at[addr] = now + delay[addr]
                delay[addr] = min(delay[addr] * 2, BOOTSTRAP_BACKOFF_S[1])
            await trio.sleep(0.5)

    async def _try_bootstrap(self, addr: str) -> str | None:
        """Dial one bootstrap address; returns None or what went wrong, in words a user can act on."""
        import multiaddr
        from libp2p.peer.id import ID

        try:
            ma = multiaddr.Multiaddr(addr)
            host = ma.value_for_protocol("ip4") or ma.value_for_protocol("ip6")
            port = int(ma.value_for_protocol("tcp"))
            pid = ID.from_base58(addr.rsplit("/p2p/", 1)[1])
        except Exception:
            return f"{INVALID_ADDRESS}: expected /ip4/HOST/tcp/PORT/p2p/PEER_ID"
        if pid.to_base58() == self.peer_id:
            return None
        timeout = self.config.stream_timeout_s
        try:
            with trio.fail_after(timeout):
                sock = await trio.open_tcp_stream(host, port)
            await sock.aclose()
        except trio.TooSlowError:
            return (
                f"no answer from {host}:{port} in {timeout:.0f} s: the host is down, the address is "
                f"wrong, or a firewall drops TCP to port {port}"
            )
        except OSError as e:
            cause = _root_os_error(e)
            if isinstance(cause, ConnectionRefusedError):
                return f"nothing listens on {host}:{port} (connection refused): is the node running, is the port right?"
            return f"cannot reach {host}:{port} ({cause.strerror or cause}): check the address and this machine's network"
        try:
            self._host.get_network().unblock_peer(pid)  # libp2p would refuse a recent failure itself
            await self._connect(addr, timeout)
        except Exception as e:
            log.debug("bootstrap handshake with %s: %r", addr, e)
            return (
                f"{host}:{port} accepts TCP but the libp2p handshake failed: the peer id in the address "
                "does not match that node's key (restarted with a new key?) or it is not a p2prl node"
            )
        return None

    def _check_network_of(self, addr: str, pid: str) -> None:
        ours = f"p2prl/{self.network_id}/"
        theirs = sorted(
            t for t, peers in self._pubsub.peer_topics.items() if pid in {p.to_base58() for p in peers}
        )
        if theirs and not any(t.startswith(ours) for t in theirs) and addr not in self._foreign:
            self._foreign.add(addr)
            self.counters.add("bootstrap_foreign")
            log.warning(
                "bootstrap peer %s belongs to another network (it gossips %s, we are %r): check the "
                "genesis file and --bootstrap",
                addr,
                theirs[0],
                self.network_id,
            )

    def advertised_addrs(self) -> list[str]:
        """Addresses to tell peers about: until a dial-back answered, our listen addresses; after,
        only those a peer could open a new connection to: behind a NAT, our relayed addresses."""
        if self.reachable is None:
            return list(self.addrs)
        if not self.reachable and self._relay_client is not None:
            return self._relay_client.circuit_addrs(self.peer_id)
        return list(self._public_addrs)

    async def _relay_loop(self) -> None:
        """Behind a NAT, hold slots at up to ``MAX_RELAYS`` relays among the peers we dialed (a
        peer that is no relay refuses the protocol); and close a relayed connection as soon as a
        direct one to the same peer exists (after a hole punch), so chunks can flow."""
        from p2prl.net.relay import MAX_RELAYS, REFRESH_S, RESERVE_EVERY_S

        asked: dict[str, float] = {}
        while True:
            await trio.sleep(1.0)
            if spare := await close_relayed_beside_direct(self._host):
                self.counters.add("relay.spare_closed", spare)
            client = self._relay_client
            if self.reachable is not False:
                continue
            direct = direct_peers(self._host)
            client.forget(direct)
            now = trio.current_time()
            for peer in sorted(client.relays):  # renew held slots well within the relay's short TTL
                if now - asked.get(peer, now) >= REFRESH_S:
                    asked[peer] = now
                    assert self._nursery is not None
                    if not await client.reserve(peer, self._nursery, self.config.stream_timeout_s):
                        client.relays.pop(peer, None)
            for peer in sorted(direct - set(client.relays)):
                if len(client.relays) >= MAX_RELAYS:
                    break
                if now - asked.get(peer, -RESERVE_EVERY_S) < RESERVE_EVERY_S or peer in self._banned:
                    continue
                asked[peer] = now
                assert self._nursery is not None
                await client.reserve(peer, self._nursery, self.config.stream_timeout_s)
            if len(asked) > 1024:
                asked = {p: t for p, t in asked.items() if now - t < RESERVE_EVERY_S or p in client.relays}

    def connections(self) -> dict[str, list[bool]]:
        """Per connected peer, whether each of its connections is relayed (reports, tests)."""
        return self._call_sync(self._connections)

    def _connections(self) -> dict[str, list[bool]]:
        return {
            pid.to_base58(): [is_relayed(getattr(c, "muxed_conn", c)) for c in conns]
            for pid, conns in self._host.get_network().get_connections_map().items()
        }

    def add_standing(self, peer_ids: list[str]) -> None:
        """Peers with standing (seen in verdicts or scores): a full relay makes room for them first,
        and the heartbeat dialer dials them first. Bounded (the newest ``STANDING_MAX``)."""
        st = self._standing
        for p in peer_ids:
            st.pop(p, None)
            st[p] = None
        while len(st) > STANDING_MAX:
            st.pop(next(iter(st)))

    def has_standing(self, peer_id: str) -> bool:
        return peer_id in self._standing

    def relay_stats(self) -> dict[str, Any]:
        """What goes through relays: as a relay, bytes carried per peer; as a client, our slots."""
        return self._call_sync(self._relay_stats)

    def _relay_stats(self) -> dict[str, Any]:
        carried = self._relay.carried() if self._relay is not None else {}
        relays = dict(self._relay_client.relays) if self._relay_client is not None else {}
        return {"carried": carried, "relays": relays}

    async def _reachability_loop(self) -> None:
        tried: set[str] = set()
        while True:
            # only a direct connection shows a helper our address: over a relayed one it would
            # dial the relay's, and a public node would take itself for one behind a NAT
            peers = sorted(p for p in direct_peers(self._host) - tried if p not in self._banned)
            if not peers:
                tried.clear()
                await trio.sleep(2.0)
                continue
            peer = peers[0]
            tried.add(peer)
            try:
                await self._dial_back(peer)
            except Exception as e:
                log.debug("dial-back via %s failed: %r", peer[-8:], e)
                await trio.sleep(2.0)
                continue
            await trio.sleep(300.0)

    async def _dial_back(self, peer: str) -> None:
        from libp2p.peer.id import ID

        ports = sorted({int(a.split("/tcp/")[1].split("/")[0]) for a in self.addrs if "/tcp/" in a})[
            : dialback.MAX_PORTS
        ]
        with trio.fail_after(self.config.stream_timeout_s + dialback.DIAL_TIMEOUT_S):
            stream = await self._host.new_stream(ID.from_base58(peer), [dialback.PROTOCOL_ID])
            try:
                ip, oks = await dialback.ask(stream, ports)
            finally:
                await stream.close()
        proto = "ip6" if ":" in ip else "ip4"
        self._public_addrs = [
            f"/{proto}/{ip}/tcp/{p}/p2p/{self.peer_id}" for p, ok in zip(ports, oks, strict=True) if ok
        ]
        self.reachable = bool(self._public_addrs)
        self.counters.add("dialback.checks")
        log.info("reachability (dial-back via %s): %s %s", peer[-8:], self.reachable, self._public_addrs)

    def _connected_ids(self) -> set[str]:
        return {p.to_base58() for p in self._host.get_connected_peers()}

    def peers(self) -> list[PeerInfo]:
        return self._call_sync(self._peers)

    def _peers(self) -> list[PeerInfo]:
        connected = self._connected_ids()
        ps = self._host.get_peerstore()
        out = []
        for pid in ps.peer_ids():
            b58 = pid.to_base58()
            if b58 == self.peer_id:
                continue
            try:
                addrs = tuple(str(a) for a in ps.addrs(pid))
            except Exception:
                addrs = ()
            out.append(PeerInfo(b58, addrs, b58 in connected, b58 in self._banned))
        return sorted(out, key=lambda p: (not p.connected, p.peer_id))

    def _bad_rpc(self, peer: str, error: Exception) -> None:
        """A peer's pubsub stream broke on its own bytes: count it, strike the peer (trio thread)."""
        self.counters.add("gossip.malformed_rpc")
        self._filter.drop(InputReason.MALFORMED, peer, f"pubsub RPC: {error!r}"[:200])

    def ban(self, peer: str, reason: str) -> None:
        """Cut a peer off for ``limits.ban_s``: no gossip from it, no chunk streams (trio thread)."""
        if peer in self._banned or peer == self.peer_id:
            return
        from libp2p.peer.id import ID

        self._banned.add(peer)
        self.counters.add("bans")
        log.warning("banned peer %s for %.0f s: %s", peer, self._banned.ban_s, reason)
        if self._pubsub is not None:
            try:
                self._pubsub.add_to_blacklist(ID.from_base58(peer))
            except Exception as e:
                log.debug("blacklisting %s: %r", peer, e)

    def is_banned(self, peer: str) -> bool:
        return peer in self._banned

    async def _unban_loop(self) -> None:
        from libp2p.peer.id import ID

        while True:
            await trio.sleep(1.0)
            for peer in self._banned.expired():
                log.info("ban of %s expired", peer)
                try:
                    self._pubsub.remove_from_blacklist(ID.from_base58(peer))
                except Exception as e:
                    log.debug("unblacklisting %s: %r", peer, e)

    # ---------------------------------------------------------------- gossip

    def subscribe(self, topic: str) -> None:
        if kind_of(self.network_id, topic) is None:
            raise ValueError(f"{topic!r} is not a topic of network {self.network_id!r}")
        self._topics.add(topic)
        if self._token is not None and self._thread is not None and self._thread.is_alive():
            self._call(self._subscribe, topic)

    async def _subscribe(self, topic: str) -> None:
        from libp2p.peer.id import ID

        if topic in self._pubsub.topic_ids:
            return
        me = self._host.get_id()

        def validator(forwarder: ID, msg: Any) -> bool:
            if forwarder == me:
                return True
            if len(msg.topicIDs) != 1:
                return self._filter.drop("malformed", forwarder.to_base58(), "multi-topic message")
            try:
                origin = ID(msg.from_id).to_base58()
            except Exception:
                origin = "?"
            return self._filter.check(topic, msg.data, forwarder.to_base58(), origin)

        self._pubsub.set_topic_validator(topic, validator, False)
        sub = await self._pubsub.subscribe(topic)
        assert self._nursery is not None
        self._nursery.start_soon(self._drain, sub)

    async def _drain(self, sub: Any) -> None:
        # delivery happens in the validator; this only keeps libp2p's 32-deep buffer from filling
        while True:
            await sub.get()

    def _deliver(self, item: Incoming) -> bool:
        with self._cond:
            if len(self._incoming) >= self.config.limits.incoming_queue:
                return False
            self._incoming.append(item)
            self._cond.notify_all()
        return True

    def grant_standing(self, signer: bytes) -> None:
        """A validator role accepted work of ``signer``: its gossip skips the unproven keys' budget."""
        self._filter.grant(signer)

    def poll(self, timeout: float = 0.0) -> list[Incoming]:
        """Everything verified since the last poll (waits up to ``timeout`` s for the first)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._incoming and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            out = list(self._incoming)
            self._incoming.clear()
        return out

    def publish(self, topic: str, envelope: bytes) -> None:
        """Queue a signed envelope for gossip, after the checks a peer would make."""
        kind = kind_of(self.network_id, topic)
        if kind is None:
            raise PublishError(f"{topic!r} is not a topic of network {self.network_id!r}")
        if len(envelope) > self.config.limits.max_msg_bytes:
            raise PublishError(
                f"envelope of {len(envelope)} bytes exceeds {self.config.limits.max_msg_bytes}"
            )
        try:
            env, _ = decode_message(envelope, self.network_id)
        except (EnvelopeError, MessageError) as e:
            raise PublishError(f"refusing to publish an invalid envelope: {e}") from e
        if env.type not in TOPIC_TYPES[kind]:
            raise PublishError(f"{env.type} does not belong on {kind}")
        self._publish_raw(topic, envelope)

    def _publish_raw(self, topic: str, data: bytes) -> None:
        """Queue bytes for gossip without local checks (tests use it to play a hostile peer)."""
        if topic not in self._topics:
            self.subscribe(topic)
        try:
            self._call_sync(self._pub_send.send_nowait, (topic, data))
        except trio.WouldBlock:
            self.counters.add(f"dropped.{GossipDrop.PUBLISH_QUEUE_FULL}")
            self.counters.add("dropped")
            log.warning("publish queue full: dropped an envelope for %s", topic)

    async def _publisher(self, recv: Any) -> None:
        gap = 1.0 / self.config.limits.publish_per_s
        async for topic, data in recv:
            self._filter.note_own(data)
            try:
                await self._pubsub.publish(topic, data)
                self.counters.add("gossip_out")
            except Exception as e:
                self.counters.add("publish_errors")
                log.warning("publish on %s failed: %r", topic, e)
            await trio.sleep(gap)

    # ---------------------------------------------------------------- blobs

    def add_provider_hint(self, blob_id: str, peer_id: str) -> None:
        """Record that ``peer_id`` says it holds ``blob_id`` (from heartbeats or announcements)."""
        with self._cond:
            peers = self._hints.setdefault(blob_id, [])
            if peer_id not in peers and peer_id != self.peer_id:
                peers.append(peer_id)
                del peers[:-64]
            while len(self._hints) > 4096:
                self._hints.pop(next(iter(self._hints)))

    def drop_hint(self, blob_id: str, peer_id: str) -> None:
        """``peer_id`` claimed ``blob_id`` and did not deliver it: ask it last from now on."""
        with self._cond:
            peers = self._hints.get(blob_id)
            if peers is not None and peer_id in peers:
                peers.remove(peer_id)

    def providers(self, blob_id: str) -> list[str]:
        with self._cond:
            hinted = list(self._hints.get(blob_id, ()))
        direct = direct_peers(self._host)
        relay_only = self._connected_ids() - direct  # chunks never go through a relay
        order = provider_order(self.peer_id, blob_id, hinted, direct)
        return [p for p in order if p not in self._banned and p != self.peer_id and p not in relay_only]

    async def open_chunk_stream(self, peer: str) -> Any:
        from libp2p.peer.id import ID

        with trio.fail_after(self.config.stream_timeout_s):
            return await self._host.new_stream(ID.from_base58(peer), [cp.PROTOCOL_ID])

    def serve(self, ref: BlobRef) -> None:
        """Announce-side: we hold ``ref`` complete; peers may fetch any chunk of it from us.

        ``ref`` must be one we made from our own bytes: we answer requests for its digest."""
        if not self.store.has(ref.id):
            raise FileNotFoundError(f"blob {ref.id[:16]} is not in the store")
        self.refs.add(ref)

    def fetch(
        self,
        ref: BlobRef,
        timeout: float = 300.0,
        on_progress: Any = None,
        s3: bool = True,
        max_bytes: int | None = None,
        keep_partial: bool = True,
        prefer: Sequence[str] = (),
    ) -> Path:
        """Fetch, verify and store ``ref``; returns its path in the store. Raises FetchError.

        ``on_progress(done_bytes, total_bytes)`` runs on the network thread: keep it quick. ``s3``
        False keeps the download on peers (for blobs nobody mirrors, such as rollout batches).
        ``max_bytes`` refuses a larger ref before anything is allocated; ``keep_partial`` False
        deletes the partial file of a failed download (rollouts: nobody resumes them). ``prefer``
        (the announcer) and ``config.reserved_providers`` (the trainer) always get a download slot.
        """
        if max_bytes is not None and ref.size > max_bytes:
            self.counters.add("fetch_refused.too_big")
            raise FetchError(f"blob {ref.id[:16]} of {ref.size} bytes exceeds the bound of {max_bytes}")
        if self.store.has(ref.id):
            return self.store.path(ref.id)
        reserved = [*prefer, *self.config.reserved_providers]
        self._call(self._fetch, ref, timeout, on_progress, s3, keep_partial, reserved)
        return self.store.path(ref.id)

    async def _fetch(
        self,
        ref: BlobRef,
        timeout: float,
        on_progress: Any,
        s3: bool = True,
        keep_partial: bool = True,
        reserved: Sequence[str] = (),
    ) -> None:
        key = ref.digest
        running = self._downloads.get(key)
        if running is not None:
            ev, errs = running
            with trio.fail_after(timeout):
                await ev.wait()
            if errs:
                raise FetchError(str(errs[0]))
            return
        ev, errs = trio.Event(), []
        self._downloads[key] = (ev, errs)
        try:
            t0 = time.monotonic()
            # opening may rescan a large partial file: never on this thread (gossip would freeze)
            part = await trio.to_thread.run_sync(self.partials.open, ref)
            mine = [p for p in reserved if p != self.peer_id]
            dl = Download(self, part, on_progress, use_s3=s3, reserved=mine)
            await dl.run(max(0.0, timeout - (time.monotonic() - t0)))
            await trio.to_thread.run_sync(self.partials.finish, ref)
            self.refs.add(ref)  # every chunk and the whole blob verified: we serve this ref now
            self.counters.add("blobs_fetched")
            log.info(
                "fetched %s (%d bytes) in %.2f s from %s",
                ref.id[:16],
                ref.size,
                time.monotonic() - t0,
                {k[-6:]: v for k, v in dl.bytes_from.items()},
            )
        except BaseException as e:
            errs.append(e)
            self.partials.release(ref, keep=keep_partial)
            raise
        finally:
            del self._downloads[key]
            ev.set()

    def stats(self) -> dict[str, int]:
        s = self.counters.snapshot()
        s.setdefault("bytes_up", 0)
        s.setdefault("bytes_down", 0)
        s.setdefault("dropped", 0)
        s.setdefault("bans", 0)
        s["banned_peers"] = len(self._banned)
        s["reachable"] = -1 if self.reachable is None else int(self.reachable)
        return s


_GUARDED: dict[type, type] = {}


def _guarded(pubsub_cls: type) -> type:
    """``Pubsub`` whose per-peer read loop ends that peer's stream on a malformed RPC, and whose
    writes of one RPC to a stream never interleave with another's.

    py-libp2p 0.8.1 parses each inbound RPC with protobuf and catches only stream errors around it:
    a ``DecodeError`` (four garbage bytes from any peer) ended the pubsub service and with it the
    node's host (test: tests/net/test_pubsub_garbage.py). Here any exception out of one peer's read
    loop resets that stream, forgets the peer's pubsub state and strikes it; the service runs on.

    Its writers to a peer's stream are two (the peer's send queue, and gossipsub's publish and
    forward paths), and yamux writes an RPC larger than one frame (64 KiB) or than the peer's window
    frame by frame, letting any other writer in between: the peer then reads two RPCs' bytes mixed,
    fails to parse them and strikes the sender. A SmolLM2 network's anchor manifest (its chunk list)
    is such an RPC: a miner banned its honest trainer for 50 of them and stopped serving it its
    rollouts (the trainer stood still). ``write_msg`` here holds a per-stream lock for the whole
    RPC (test: tests/net/test_pubsub_writes.py)."""
    if pubsub_cls not in _GUARDED:

        class GuardedPubsub(pubsub_cls):  # type: ignore[misc, valid-type]
            on_bad_rpc: Any = None
            _write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] | None = None

            async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
                if self._write_locks is None:
                    self._write_locks = weakref.WeakKeyDictionary()
                lock = self._write_locks.get(stream)
                if lock is None:
                    lock = self._write_locks[stream] = trio.Lock()
                async with lock:
                    return bool(await super().write_msg(stream, rpc_msg))

            async def continuously_read_stream(self, stream: Any) -> None:
                try:
                    await super().continuously_read_stream(stream)
                except Exception as e:
                    peer = stream.muxed_conn.peer_id
                    with contextlib.suppress(Exception):
                        await stream.reset()
                    with contextlib.suppress(Exception):
                        self._handle_dead_peer(peer)
                    if self.on_bad_rpc is not None:
                        self.on_bad_rpc(peer.to_base58(), e)

        _GUARDED[pubsub_cls] = GuardedPubsub
    return _GUARDED[pubsub_cls]


@contextlib.asynccontextmanager
async def _nothing() -> Any:
    yield


def _root_os_error(e: OSError) -> OSError:
    """trio reports a failed connect as "all attempts failed", the reason (refused, unreachable)
    inside: the first OSError with an errno."""
    todo: list[BaseException] = [e]
    while todo:
        x = todo.pop(0)
        if isinstance(x, OSError) and x.errno:
            return x
        todo.extend(getattr(x, "exceptions", ()))
        if x.__cause__ is not None:
            todo.append(x.__cause__)
    return e
