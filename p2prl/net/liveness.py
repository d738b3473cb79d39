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
"""

from __future__ import annotations

import logging
from typing import Any

import trio

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0


class ConnectionWatch:
    """A libp2p network notifee; ``run`` does the work on the host's nursery (callbacks stay quick)."""

    def __init__(self, host: Any, pubsub: Any, counters: Any, queue: int = 256) -> None:
        self.host = host
        self.pubsub = pubsub
        self.counters = counters
        self._send, self._recv = trio.open_memory_channel[tuple[str, Any]](queue)
        self._nursery: trio.Nursery | None = None

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
            with trio.move_on_after(PROBE_TIMEOUT_S):
                try:
                    await conn.close()
                except Exception as e:
                    log.debug("closing dead connection: %r", e)
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

    def _restore(self, peer: Any, topics: list[str]) -> None:
        from libp2p.pubsub.pb import rpc_pb2

        if not self._connections(peer):
            return
        for t in topics:
            self.pubsub.handle_subscription(peer, rpc_pb2.RPC.SubOpts(subscribe=True, topicid=t))

    async def _restore_later(self, peer: Any, topics: list[str]) -> None:
        # the old stream's writer may still fail a moment later and wipe them once more
        for delay in (0.5, 2.0):
            await trio.sleep(delay)
            self._restore(peer, topics)
