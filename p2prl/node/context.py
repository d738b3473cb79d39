"""What every role shares: identity, verified genesis, blob store, network host, status, stop flag.

``build_context`` turns a NodeConfig into a started NodeContext; the message pump
(:class:`Pump`) reads verified gossip once and hands each message type to the role's handler, and
the heartbeat loop tells peers which blobs this node can serve.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2prl.crypto.keys import Identity, load_or_create_identity
from p2prl.net.config import NetConfig
from p2prl.net.store import BlobStore
from p2prl.node.config import NodeConfig
from p2prl.node.genesis import SignedGenesis, pin_genesis, read_genesis
from p2prl.node.status import NodeStatus
from p2prl.protocol.blobs import BlobRef
from p2prl.protocol.messages import Genesis, Heartbeat, PatchManifest, Scores, Verdict, encode_message
from p2prl.protocol.sections import GenerationSpec

log = logging.getLogger(__name__)


class NodeStartError(Exception):
    """The node cannot start (bad genesis, pinned to another network, key file problem, ...)."""


@dataclass
class NodeContext:
    config: NodeConfig
    genesis: SignedGenesis
    identity: Identity
    store: BlobStore
    net: Any  # p2prl.net.P2PNode
    status: NodeStatus
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def g(self) -> Genesis:
        return self.genesis.genesis

    @property
    def network_id(self) -> str:
        return self.genesis.network_id

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    def topic(self, kind: str) -> str:
        from p2prl.net.topics import topic

        return topic(self.network_id, kind)

    def publish(self, kind: str, msg: Any) -> bool:
        """Sign and gossip ``msg``; a refusal or a stopped host is logged and counted, never raised."""
        try:
            env = encode_message(self.identity, self.network_id, msg)
            self.net.publish(self.topic(kind), env)
        except Exception as e:  # a publish must never take a role loop down
            self.status.incr_label("publish_failed", type(e).__name__)
            log.warning("publish of %s failed: %s", msg.TYPE, e)
            return False
        return True

    def publish_raw(self, kind: str, envelope: bytes) -> bool:
        try:
            self.net.publish(self.topic(kind), envelope)
        except Exception as e:
            self.status.incr_label("publish_failed", type(e).__name__)
            log.warning("publish on %s failed: %s", kind, e)
            return False
        return True

    def fetch_rollouts(self, ref: BlobRef, announcer: str, timeout: float, on_progress: Any = None) -> Path:
        """Fetch a rollout batch from peers: refused above the genesis batch bound before any byte is
        allocated, the announcer always asked, a failed download's partial file deleted (nobody
        resumes a rollout batch; a 16 GiB sparse file would evict resumable ones)."""
        self.net.add_provider_hint(ref.id, announcer)
        return self.net.fetch(
            ref,
            timeout=timeout,
            on_progress=on_progress,
            s3=False,
            max_bytes=rollout_blob_bound(self.g.generation),
            keep_partial=False,
            prefer=[announcer],
        )

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a role thread that logs (and counts) a crash instead of dying silently, then stops the node."""

        def run() -> None:
            try:
                target()
            except Exception:
                log.exception("%s thread crashed; stopping the node", name)
                self.status.incr_label("thread_crash", name)
                self.stop.set()

        t = threading.Thread(target=run, name=f"p2prl-{name}", daemon=True)
        self.threads.append(t)
        t.start()
        return t

    def spawn_pump(
        self, handlers: dict[str, Handler], holds: Callable[[], list[str]], version: Callable[[], int]
    ) -> threading.Thread:
        """Start the gossip pump every role runs: verified messages to ``handlers``, heartbeats out."""
        return self.spawn("pump", Pump(self, handlers, holds, version).run)

    def join(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("thread %s did not stop in time", t.name)


def rollout_blob_bound(generation: GenerationSpec) -> int:
    """The largest rollout batch blob an honest miner can make under genesis' generation settings.

    The layout of p2prl/proof/batch.py, at its most: a 77-byte header; per group 16 bytes and at
    most 4,096 prompt token ids of 4 bytes; per rollout 12 bytes and, per completion token, an id
    (4), a behaviour logprob (4) and a sketch (SKETCH_DIM); capped at the decoder's 64 MiB bound,
    plus zstd's worst-case growth of incompressible input.
    """
    from p2prl.proof.batch import MAGIC, BatchLimits
    from p2prl.proof.fingerprint import SKETCH_DIM

    lim = BatchLimits()
    groups = min(generation.groups_per_batch, lim.max_groups)
    per_group = min(generation.group_size, lim.max_rollouts_per_group)
    tokens = min(generation.max_new_tokens, lim.max_completion_tokens)
    rollout = 12 + tokens * (8 + SKETCH_DIM)
    raw = 77 + groups * (16 + 4 * lim.max_prompt_tokens + per_group * rollout)
    raw = min(raw, lim.max_decoded_bytes)
    return len(MAGIC) + raw + raw // 128 + 1024


def allowed_signers(sg: SignedGenesis) -> dict[str, set[bytes]]:
    """Who may sign what: manifests and genesis the trainer, verdicts and scores the genesis validators."""
    validators = set(sg.validator_keys)
    return {
        PatchManifest.TYPE: {sg.trainer_key},
        Genesis.TYPE: {sg.trainer_key},
        Verdict.TYPE: validators,
        Scores.TYPE: validators,
    }


def s3_config(cfg: NodeConfig, sg: SignedGenesis) -> Any:
    """The S3 settings: genesis location, overridden by the node's own flags; None when disabled."""
    if not cfg.s3_enable:
        return None
    from p2prl.protocol.sections import S3Spec

    g = sg.genesis.s3 or S3Spec()
    bucket = cfg.s3_bucket or g.bucket
    if not bucket:
        return None
    from p2prl.net.s3 import S3Config

    endpoint = (cfg.s3_endpoint or g.endpoint) or None
    # credentials sign only requests to the endpoint this node's operator named, never to one that
    # only the genesis (whoever wrote it) names (docs/SECURITY.md, item 20)
    sign = cfg.s3_sign and endpoint == (cfg.s3_endpoint or None)
    return S3Config(
        bucket=bucket,
        endpoint_url=endpoint,
        prefix=cfg.s3_prefix or g.prefix,
        region=cfg.s3_region or g.region,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") if sign else None,
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") if sign else None,
    )


def load_genesis_for(cfg: NodeConfig) -> tuple[Identity, SignedGenesis]:
    from p2prl.crypto.keys import KeyFileError
    from p2prl.node.genesis import GenesisError

    assert cfg.network is not None
    try:
        sg = read_genesis(cfg.network, cfg.trainer_key)
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        pin_genesis(sg, cfg.data_dir)
        identity = load_or_create_identity(cfg.key_path)
    except (GenesisError, KeyFileError) as e:
        raise NodeStartError(str(e)) from e
    role_ok = {
        "trainer": identity.public_key == sg.trainer_key,
        "validator": identity.public_key in sg.validator_keys,
        "miner": identity.public_key != sg.trainer_key and identity.public_key not in sg.validator_keys,
    }
    if not role_ok[cfg.role]:
        raise NodeStartError(
            f"key {identity.public_hex[:16]}… cannot act as {cfg.role} in this network "
            "(the trainer key is in genesis; validators are listed there; miners are neither)"
        )
    return identity, sg


def net_config(cfg: NodeConfig, sg: SignedGenesis, identity: Identity) -> NetConfig:
    """The network layer's settings for this node: bootstrap peers (without itself), S3, who may sign
    what, and the trainer's superseeding (its uplink is the scarce one)."""
    bootstrap = [a for a in [*sg.genesis.bootstrap, *cfg.bootstrap] if not a.endswith(_peer_suffix(identity))]
    return NetConfig(
        listen=cfg.listen,
        bootstrap=bootstrap,
        s3=s3_config(cfg, sg),
        allowed_signers=allowed_signers(sg),
        superseed=cfg.superseed_s > 0 and cfg.role == "trainer",
        superseed_cooldown_s=cfg.superseed_s or 1.0,
        max_upload_bytes_per_s=cfg.max_upload_mb_s * 1e6,
        mdns=cfg.mdns,
        reserved_providers=_reserved_providers(sg, identity),
    )


def _reserved_providers(sg: SignedGenesis, identity: Identity) -> list[str]:
    """The peers every download asks, whatever else claims a blob: the trainer (it holds every patch)
    and the genesis validators (they hold every rollout batch they judged and every patch)."""
    from p2prl.net.identity import peer_id_of_public_key

    keys = [sg.trainer_key, *sg.validator_keys]
    return [peer_id_of_public_key(k) for k in dict.fromkeys(keys) if k != identity.public_key]


def build_context(cfg: NodeConfig) -> NodeContext:
    """Verify genesis, load the identity, open the store and start the network host."""
    from p2prl.net.node import P2PNode

    identity, sg = load_genesis_for(cfg)
    store = BlobStore(cfg.data_dir / "blobs", cfg.store_max_bytes)
    net_cfg = net_config(cfg, sg, identity)
    net = P2PNode(identity, sg.network_id, store, net_cfg)
    status = NodeStatus(cfg.role, identity.public_hex, sg.network_id)
    try:
        net.start()
    except RuntimeError as e:
        raise NodeStartError(f"network host failed to start: {e}") from e
    status.set(peer_id=net.peer_id, addrs=list(net.addrs))
    for t in (
        "manifests",
        "rollouts",
        "verdicts",
        "heartbeats",
    ):
        net.subscribe(_topic(sg.network_id, t))
    return NodeContext(cfg, sg, identity, store, net, status)


def _topic(network_id: str, kind: str) -> str:
    from p2prl.net.topics import topic

    return topic(network_id, kind)


def _peer_suffix(identity: Identity) -> str:
    from p2prl.net.identity import peer_id_for

    return "/p2p/" + peer_id_for(identity)


Handler = Callable[[Any], None]


class Pump:
    """Reads verified gossip and dispatches by envelope type; also sends heartbeats.

    Handlers run on the pump thread and must only enqueue work. Heartbeats from peers become
    provider hints, so fetches ask the peers that actually hold a blob.
    """

    def __init__(
        self,
        ctx: NodeContext,
        handlers: dict[str, Handler],
        holds: Callable[[], list[str]],
        version: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.handlers = handlers
        self.holds = holds
        self.version = version
        self._last_hb = 0.0
        self.dialer = Dialer(ctx)

    def run(self) -> None:
        ctx = self.ctx
        ctx.spawn("dial", self.dialer.run)
        while not ctx.stop.is_set():
            for item in ctx.net.poll(timeout=0.5):
                t = item.envelope.type
                if t == Heartbeat.TYPE:
                    self._on_heartbeat(item)
                h = self.handlers.get(t)
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

    def _on_heartbeat(self, item: Any) -> None:
        hb: Heartbeat = item.message
        origin = getattr(item, "origin", item.from_peer)
        if hb.peer_id != origin:
            self.ctx.status.incr_label("dropped", "heartbeat_peer_mismatch")
            return
        for blob_id in hb.holds[:256]:
            self.ctx.net.add_provider_hint(blob_id, hb.peer_id)
        self.dialer.offer(hb.peer_id, hb.addrs)

    def _heartbeat(self) -> None:
        ctx = self.ctx
        hb = Heartbeat(
            role=ctx.config.role,
            version=self.version(),
            peer_id=ctx.net.peer_id,
            addrs=tuple(ctx.net.advertised_addrs()[:16]),
            holds=tuple(self.holds()[-256:]),
            stats={k: int(v) for k, v in list(ctx.status.snapshot()["counters"].items())[:32]},
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

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self._want: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.local = bool(getattr(ctx.config, "local_network", False))

    def offer(self, peer_id: str, addrs: tuple[str, ...]) -> None:
        if peer_id == self.ctx.net.peer_id:
            return
        usable = tuple(a for a in addrs if _dialable(a, self.local))[:4]
        if not usable:
            return
        now = time.monotonic()
        with self._lock:
            self._want.pop(peer_id, None)
            self._want[peer_id] = (now, usable)
            self._expire(now)
            while len(self._want) > 4 * self.MAX_PEERS:
                self._want.popitem(last=False)
        self._wake.set()

    def wanted(self) -> list[str]:
        with self._lock:
            self._expire(time.monotonic())
            return list(self._want)

    def _expire(self, now: float) -> None:
        while self._want and now - next(iter(self._want.values()))[0] > self.WANT_TTL_S:
            self._want.popitem(last=False)

    def run(self) -> None:
        ctx = self.ctx
        while not ctx.stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                connected = {p.peer_id for p in ctx.net.peers() if p.connected}
            except Exception:
                continue
            with self._lock:
                self._expire(time.monotonic())
                todo = [(p, a) for p, (_, a) in reversed(self._want.items()) if p not in connected]
            now = time.monotonic()
            for peer_id, addrs in todo:
                if ctx.stop.is_set() or len(connected) >= self.MAX_PEERS:
                    break
                if now - self._tried.get(peer_id, -1e9) < self.RETRY_S:
                    continue
                self._tried[peer_id] = now
                for a in addrs:
                    full = a if "/p2p/" in a else f"{a}/p2p/{peer_id}"
                    try:
                        ctx.net.connect(full, timeout=5.0)
                        connected.add(peer_id)
                        ctx.status.incr("peers_dialed")
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
