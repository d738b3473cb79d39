"""Keeps gossip and chunk streams off dead connections when a peer comes back with the same id.

py-libp2p 0.8.1 keeps one pubsub stream per peer id and drops it only once the peer has no
connection left. A peer that vanished without closing its socket (crash, power loss, a NAT that
forgot the flow) leaves a half-open connection behind; when it restarts with the same key and
dials again, the old connection still counts as live, pubsub keeps writing into it ("already has
pubsub stream") and new streams are spread over both connections. The watch reacts to two events:

- a new connection to a peer that already has one: every older connection is pinged
  (``/ipfs/ping/1.0.0`` on that very connection); one that does not answer in time is closed;
- a connection closing while the peer has another one: if pubsub's stream to the peer ran over
  it, pubsub forgets the peer and registers it again over the live connection (a fresh stream,
  mesh membership re-grafted on the next heartbeat) instead of losing the next message to it.

A sweep (``sweep_loop``) catches what no event reports: a connected peer whose subscriptions we
know (or for whom gossipsub queues messages) while pubsub holds no live stream to it. py-libp2p
then queues every message for it "until identify completes" (100 at most, the oldest dropped) and
nothing ever flushes them: ``new_stream`` over a half-dead connection can hang without a timeout,
and a hung retry task blocks every later retry for that peer. The sweep pings the peer's
connections, closes the dead ones, opens the stream itself under a timeout, and when the peer is
still stuck after ``RESET_S`` closes every connection to it so both sides start clean (the
bootstrap loop and the dialer dial again). It also pings the connections of a registered peer
whose outbound queue has not emptied for ``STUCK_S`` (a connection that takes no bytes blocks the
writer without an error) and cuts those that do not answer.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0
SWEEP_S = 2.0  # how often the sweep looks for stuck peers
STUCK_S = 4.0  # connected and wanted but unregistered this long: repair (startup races take ms)
RETRY_S = 10.0  # bound on one attempt to open the pubsub stream (py-libp2p has none)
RESET_S = 30.0  # still stuck this long: close every connection to the peer
RESTORE_S = 10.0  # how long remembered subscriptions wait for the peer's stream


class ConnectionWatch:
    """A libp2p network notifee; ``run`` does the work on the host's nursery (callbacks stay quick)."""

    def __init__(self, host: Any, pubsub: Any, counters: Any, queue: int = 256) -> None:
        self.host = host
        self.pubsub = pubsub
        self.counters = counters
        self._send, self._recv = trio.open_memory_channel[tuple[str, Any]](queue)
        self._nursery: trio.Nursery | None = None
        self._stuck_since: dict[Any, float] = {}
        self._repairing: set[Any] = set()
        self._remembered: dict[Any, list[str]] = {}  # topics of peers awaiting a new stream
        self._tasks: set[tuple[Any, str]] = set()  # repair steps still running, per peer
        self._backlog_since: dict[Any, float] = {}  # peers whose outbound queue is not empty

    # ------------------------------------------------------------ INotifee (called by the swarm)

    async def opened_stream(self, network: Any, stream: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def closed_stream(self, network: Any, stream: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def listen(self, network: Any, multiaddr: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def connected(self, network: Any, conn: Any) -> None:
        self._queue("connected", conn)
        await trio.lowlevel.checkpoint()

    async def disconnected(self, network: Any, conn: Any) -> None:
        self._queue("disconnected", conn)
        await trio.lowlevel.checkpoint()

    def _queue(self, event: str, conn: Any) -> None:
        try:
            self._send.send_nowait((event, conn))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("connection watch queue full: %s event dropped", event)

    # ------------------------------------------------------------ work

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            async for event, conn in self._recv:
                try:
                    peer = conn.muxed_conn.peer_id
                except Exception:
                    continue
                if event == "connected":
                    others = [c for c in self._connections(peer) if c is not conn]
                    if others:
                        nursery.start_soon(self._check_old, peer, others)
                else:
                    self._forget_stream_on(peer, conn)

    def _connections(self, peer: Any) -> list[Any]:
        try:
            return list(self.host.get_network().get_connections(peer))
        except Exception:
            return []

    async def _check_old(self, peer: Any, old: list[Any]) -> None:
        for conn in old:
            if await self.probe(conn):
                continue
            log.info("closing a dead connection to %s (it came back on a new one)", peer.to_base58()[-8:])
            self.counters.add("dead_conns_closed")
            await self._close(conn)
            self._forget_stream_on(peer, conn)

    async def probe(self, conn: Any) -> bool:
        """True if the peer answers a ping on this very connection within PROBE_TIMEOUT_S."""
        from libp2p.host.ping import ID as PING_ID
        from libp2p.host.ping import perform_ping_roundtrip
        from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator

        stream = None
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                stream = await conn.new_stream()
                await self.host.multiselect_client.select_one_of(
                    [PING_ID], MultiselectCommunicator(stream), int(PROBE_TIMEOUT_S)
                )
                await perform_ping_roundtrip(stream)
                return True
            except Exception as e:
                log.debug("ping probe failed: %r", e)
            finally:
                if stream is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                        try:
                            await stream.reset()
                        except Exception:
                            pass
        return False

    def _forget_stream_on(self, peer: Any, conn: Any) -> None:
        """Pubsub's stream to ``peer`` ran over ``conn`` (now gone): re-register the peer."""
        stream = self.pubsub.peers.get(peer)
        if stream is None or getattr(stream, "muxed_conn", None) is not conn.muxed_conn:
            return
        if not any(c is not conn for c in self._connections(peer)):
            return  # no connection left: libp2p's own dead-peer handling takes over
        log.info("pubsub stream to %s was on a closed connection: re-registering", peer.to_base58()[-8:])
        self.counters.add("pubsub_reregistered")
        # libp2p's dead-peer handling forgets the topics the peer announced, and a peer that
        # believes its own stream is fine never announces them again: remember and restore them
        topics = [t for t, peers in self.pubsub.peer_topics.items() if peer in peers]
        try:
            self.pubsub._handle_dead_peer(peer)  # drops the stream, reopens it over a live connection
        except Exception as e:
            log.warning("re-registering %s with pubsub: %r", peer.to_base58()[-8:], e)
        self._restore(peer, topics)
        if self._nursery is not None and topics:
            self._nursery.start_soon(self._restore_later, peer, topics)

    def _registered(self, peer: Any) -> bool:
        """Pubsub holds a stream to ``peer`` that its router knows, on a connection still open."""
        stream = self.pubsub.peers.get(peer)
        if stream is None or peer not in getattr(self.pubsub.router, "peer_protocol", {peer: 0}):
            return False
        muxed = getattr(stream, "muxed_conn", None)
        if getattr(muxed, "is_closed", False):
            return False
        return any(getattr(c, "muxed_conn", None) is muxed for c in self._connections(peer))

    def _restore(self, peer: Any, topics: list[str]) -> None:
        """Give pubsub back the topics ``peer`` announced, once it holds a stream to the peer.

        Before that they stay in ``_remembered``: a subscribed peer without a stream only collects
        messages in gossipsub's pending queue, which nothing flushes."""
        from libp2p.pubsub.pb import rpc_pb2

        if not self._connections(peer):
            self._remembered.pop(peer, None)
            return
        if not self._registered(peer):
            if topics:
                self._remembered[peer] = list(topics)
            return
        self._remembered.pop(peer, None)
        for t in topics:
            if peer not in self.pubsub.peer_topics.get(t, ()):
                self.pubsub.handle_subscription(peer, rpc_pb2.RPC.SubOpts(subscribe=True, topicid=t))

    async def _restore_later(self, peer: Any, topics: list[str]) -> None:
        # the new stream takes a moment; the old stream's writer may still fail and wipe the
        # topics once more: keep restoring for a while (the sweep is the backstop after that)
        end = trio.current_time() + RESTORE_S
        while trio.current_time() < end:
            await trio.sleep(0.25)
            self._restore(peer, topics)

    # ------------------------------------------------------------ sweep

    def stuck_peers(self) -> list[Any]:
        """Connected peers pubsub should write to (subscribed, remembered, with queued messages,
        or registered) but holds no live stream for; banned peers are left alone."""
        ps = self.pubsub
        wanted: set[Any] = set(ps.peers) | set(self._remembered)
        for peers in list(ps.peer_topics.values()):
            wanted |= peers
        pending = getattr(ps.router, "_pending_messages", {})
        wanted |= {p for p, q in list(pending.items()) if q}
        out = []
        for peer in wanted:
            try:
                if ps.is_peer_blacklisted(peer) or not self._live(peer):
                    continue
            except Exception:
                continue
            if not self._registered(peer):
                out.append(peer)
        return out

    def _live(self, peer: Any) -> list[Any]:
        return [
            c
            for c in self._connections(peer)
            if not getattr(getattr(c, "muxed_conn", None), "is_closed", False)
        ]

    async def sweep_loop(self) -> None:
        """Every ``SWEEP_S``: repair peers stuck for ``STUCK_S`` (runs on the host's nursery)."""
        while True:
            await trio.sleep(SWEEP_S)
            try:
                self.sweep(trio.current_time())
            except Exception as e:
                log.debug("pubsub sweep: %r", e)

    def sweep(self, now: float) -> None:
        for peer in list(self._remembered):
            if not self._connections(peer):
                del self._remembered[peer]
        self._act_on_lasting(set(self.stuck_peers()), self._stuck_since, self._repair, now)
        # a registered stream whose writer made no way through its queue: the connection may
        # take no bytes (a peer that stopped reading, a NAT that dropped the flow)
        backlogged = {p for p, q in list(self.pubsub.peer_queues.items()) if len(q)}
        self._act_on_lasting(backlogged, self._backlog_since, self._unblock, now)

    def _act_on_lasting(self, peers: set[Any], since_of: dict[Any, float], act: Any, now: float) -> None:
        """Track since when each of ``peers`` has been in that state (forgetting those no longer in
        it); one in it for STUCK_S gets ``act(peer, since)`` started, once at a time per peer."""
        for peer in list(since_of):
            if peer not in peers:
                del since_of[peer]
        for peer in peers:
            since = since_of.setdefault(peer, now)
            if now - since >= STUCK_S and peer not in self._repairing and self._nursery is not None:
                self._repairing.add(peer)
                self._nursery.start_soon(act, peer, since)

    async def _unblock(self, peer: Any, since: float) -> None:
        """Close the connections of a backlogged peer that do not answer a ping (the writer then
        fails and pubsub re-registers the peer); a peer that answers is only slow: left alone."""
        try:
            dead: list[Any] = []
            await self._bounded(2 * PROBE_TIMEOUT_S, peer, self._close_dead, peer, dead)
            if dead:
                self.counters.add("pubsub_unblocked")
                log.info(
                    "pubsub's writes to %s stalled for %.0f s: %d dead connection(s) closed",
                    peer.to_base58()[-8:],
                    trio.current_time() - since,
                    len(dead),
                )
            self._backlog_since.pop(peer, None)
        finally:
            self._repairing.discard(peer)

    async def _repair(self, peer: Any, since: float) -> None:
        short = peer.to_base58()[-8:]
        try:
            topics = self._remembered.get(peer) or [
                t for t, peers in self.pubsub.peer_topics.items() if peer in peers
            ]
            dead: list[Any] = []
            await self._bounded(2 * PROBE_TIMEOUT_S, peer, self._close_dead, peer, dead)
            if self.pubsub.peers.get(peer) is not None:  # a stream pubsub cannot use: drop it first
                try:
                    self.pubsub._handle_dead_peer(peer)
                except Exception as e:
                    log.debug("dropping %s's pubsub stream: %r", short, e)
            if self._live(peer):
                await self._bounded(RETRY_S, peer, self.pubsub._handle_new_peer_with_retry, peer, RETRY_S)
            self._restore(peer, topics)
            ok = self._registered(peer)
            stuck_s = trio.current_time() - since
            self.counters.add("pubsub_repaired" if ok else "pubsub_repair_failed")
            log.log(
                logging.INFO if ok else logging.DEBUG,
                "pubsub had no usable stream to %s for %.0f s: %d dead connection(s) closed, %s",
                short,
                stuck_s,
                len(dead),
                "stream reopened" if ok else "still stuck",
            )
            if not ok and stuck_s >= RESET_S:
                await self._reset(peer, stuck_s)
        finally:
            self._repairing.discard(peer)

    async def _bounded(self, seconds: float, peer: Any, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` as its own task and wait at most ``seconds`` (+1) for it; True if it ended.

        py-libp2p resets a failed or cancelled stream inside a shielded scope with no deadline,
        so on a connection whose writes block a cancelled call outlives its timeout: the repair
        goes on without it (and the reset that follows closes that connection, which ends it). At
        most one such task per peer and step runs at a time."""
        key = (peer, getattr(fn, "__name__", ""))
        if key in self._tasks or self._nursery is None:
            return False
        done = trio.Event()
        self._tasks.add(key)

        async def run() -> None:
            try:
                with trio.move_on_after(seconds):
                    await fn(*args)
            except Exception as e:
                log.debug("%s for %s: %r", key[1], peer.to_base58()[-8:], e)
            finally:
                self._tasks.discard(key)
                done.set()

        self._nursery.start_soon(run)
        with trio.move_on_after(seconds + 1.0):
            await done.wait()
        return done.is_set()

    async def _close_dead(self, peer: Any, dead: list[Any]) -> None:
        """Ping each of ``peer``'s connections at once; close those that do not answer."""

        async def check(conn: Any) -> None:
            if not await self.probe(conn):
                dead.append(conn)

        async with trio.open_nursery() as n:
            for conn in self._live(peer):
                n.start_soon(check, conn)
        for conn in dead:
            self.counters.add("dead_conns_closed")
            await self._close(conn)

    async def _reset(self, peer: Any, stuck_s: float) -> None:
        log.info(
            "pubsub still has no stream to %s after %.0f s: closing every connection to it",
            peer.to_base58()[-8:],
            stuck_s,
        )
        self.counters.add("stuck_peer_resets")
        self._remembered.pop(peer, None)
        self._stuck_since.pop(peer, None)
        if self._nursery is not None:
            for conn in self._connections(peer):
                self._nursery.start_soon(self._close, conn)

    async def _close(self, conn: Any) -> None:
        """Close ``conn``. A connection that takes no bytes cannot say goodbye: yamux's GO_AWAY
        waits for its writer forever, and a cancelled close leaves the connection listed yet
        marked closed (a zombie). So its socket is shut first; libp2p's close then fails fast on
        it and cleans up (a relayed connection has no socket of its own: closed politely)."""
        sock = _socket_of(conn)
        if sock is not None:
            try:
                sock.close()  # wakes every task blocked on it with an error
            except Exception as e:
                log.debug("closing a socket: %r", e)
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                await conn.close()
            except Exception as e:
                log.debug("closing a connection: %r", e)


def _socket_of(conn: Any) -> Any:
    """The trio socket under a libp2p connection (muxer, security session, raw connection,
    TCP stream), or None (a relayed connection runs over another connection's stream)."""
    x = getattr(conn, "muxed_conn", None)
    for _ in range(8):
        if isinstance(x, trio.SocketStream):
            return x.socket
        nxt = None
        for attr in ("secured_conn", "conn", "stream"):
            nxt = getattr(x, attr, None)
            if nxt is not None and nxt is not x:
                break
        if nxt is None:
            return None
        x = nxt
    return None
