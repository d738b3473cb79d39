"""The gossip pump every role runs: verified messages to the role's handlers, heartbeats out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from p2prl.lru import LRU
from p2prl.net import Dialer, Incoming, peer_id_of_public_key
from p2prl.node.runtime.port import NetPort
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.config import NodeConfig
from p2prl.protocol import Heartbeat, Message, Scores, Verdict
from p2prl.reasons import NodeDrop

log = logging.getLogger(__name__)


M = TypeVar("M", bound=Message)
Handler = Callable[[Incoming[Any]], None]
STANDING_PER_SCORES = 256  # miners taken from one Scores message, highest first


class Handlers:
    """A role's handlers, one per message class: ``on(Verdict, f)`` types ``f``'s argument as an
    ``Incoming[Verdict]``, and :meth:`handler` hands ``f`` only messages of that class."""

    def __init__(self) -> None:
        self._by_type: dict[str, tuple[type[Message], Handler]] = {}

    def on(self, cls: type[M], handler: Callable[[Incoming[M]], None]) -> Handlers:
        if cls.TYPE in self._by_type:
            raise ValueError(f"a second handler for {cls.TYPE}")
        self._by_type[cls.TYPE] = (cls, handler)
        return self

    def handler(self, item: Incoming[Any]) -> Handler | None:
        """``item``'s handler, or None (no handler, or a body that is not the declared class)."""
        entry = self._by_type.get(item.envelope.type)
        if entry is None or not isinstance(item.message, entry[0]):
            return None
        return entry[1]

    def types(self) -> list[str]:
        return sorted(self._by_type)


class PumpHost(Protocol):
    """What the pump uses of a node (``NodeRuntime`` has it): the pump knows no runtime, so the
    runtime can start pumps without an import circle."""

    config: NodeConfig
    net: NetPort
    status: NodeStatus
    stop: threading.Event

    def publish(self, kind: str, msg: Message) -> bool: ...

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread: ...


class Pump:
    """Reads verified gossip and dispatches by envelope type; also sends heartbeats.

    Handlers run on the pump thread and must only enqueue work. Heartbeats from peers become
    provider hints, so fetches ask the peers that actually hold a blob.
    """

    def __init__(
        self,
        ctx: PumpHost,
        handlers: Handlers,
        holds: Callable[[], list[str]],
        version: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.handlers = handlers
        self.holds = holds
        self.version = version
        self._last_hb = 0.0
        self._peer_ids: LRU[str, str] = LRU(4096)  # key hex -> peer id (a key conversion costs)
        self.dialer = Dialer(
            ctx.net,
            ctx.stop,
            local=ctx.config.local_network,
            on_dialed=lambda: ctx.status.incr("peers_dialed"),
        )

    def run(self) -> None:
        ctx = self.ctx
        ctx.spawn("dial", self.dialer.run)
        while not ctx.stop.is_set():
            for item in ctx.net.poll(timeout=0.5):
                t = item.envelope.type
                if t == Heartbeat.TYPE:
                    self._on_heartbeat(item)
                elif t in (Verdict.TYPE, Scores.TYPE):
                    self._note_standing(item)
                h = self.handlers.handler(item)
                if h is None:
                    continue
                try:
                    h(item)
                except Exception as e:  # one bad message never stops the pump
                    ctx.status.incr_label("handler_error", t)
                    log.warning("handler for %s failed: %r", t, e)
            now = time.monotonic()
            if now - self._last_hb >= ctx.config.heartbeat_s:
                self._last_hb = now
                self._heartbeat()
            self._refresh_status()

    def _on_heartbeat(self, item: Incoming[Heartbeat]) -> None:
        hb = item.message
        if hb.peer_id != item.origin:
            self.ctx.status.incr_label("dropped", NodeDrop.HEARTBEAT_PEER_MISMATCH)
            return
        for blob_id in hb.holds[: Heartbeat.HINTED_HOLDS]:
            self.ctx.net.add_provider_hint(blob_id, hb.peer_id)
        self.dialer.offer(hb.peer_id, hb.addrs)

    def _note_standing(self, item: Incoming[Verdict | Scores]) -> None:
        """Peers a genesis validator vouched for (it, and miners with accepted work) have standing: a
        full relay makes room for them first (net/relay.py), the dialer dials them first."""
        msg = item.message
        keys = [item.envelope.signer_hex]
        if isinstance(msg, Verdict) and msg.accepted:
            keys.append(msg.miner)
        elif isinstance(msg, Scores):
            top = sorted((k for k, v in msg.scores.items() if v > 0), key=lambda k: -msg.scores[k])
            keys += top[:STANDING_PER_SCORES]
        peers = []
        for k in keys:
            pid = self._peer_ids.get(k)
            if pid is None:
                try:
                    pid = peer_id_of_public_key(bytes.fromhex(k))
                except Exception:
                    continue
                self._peer_ids.put(k, pid)
            peers.append(pid)
        self.ctx.net.add_standing(peers)

    def _heartbeat(self) -> None:
        ctx = self.ctx
        counters = ctx.status.snapshot()["counters"]
        hb = Heartbeat(
            role=ctx.config.role,
            version=self.version(),
            peer_id=ctx.net.peer_id,
            addrs=tuple(ctx.net.advertised_addrs()[: Heartbeat.MAX_ADDRS]),
            holds=tuple(self.holds()[-Heartbeat.SENT_HOLDS :]),
            stats={k: int(v) for k, v in list(counters.items())[: Heartbeat.SENT_STATS]},
        )
        ctx.publish("heartbeats", hb)

    def _refresh_status(self) -> None:
        ctx = self.ctx
        try:
            peers = ctx.net.peers()
            stats = ctx.net.stats()
        except Exception:
            return
        ctx.status.set(peers=sum(1 for p in peers if p.connected), addrs=list(ctx.net.addrs))
        for k in ("bytes_up", "bytes_down", "bytes_s3", "dropped", "bans"):
            ctx.status.gauge(f"net_{k}", stats.get(k, 0))
