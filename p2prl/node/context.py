"""What every role shares: identity, verified genesis, blob store, network host, status, stop flag.

``p2prl.node.startup.build_context`` turns a NodeConfig into a started NodeContext; the message
pump (:class:`p2prl.node.pump.Pump`) reads verified gossip once and hands each message type to the
role's handler, and sends the heartbeats that tell peers which blobs this node can serve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2prl.crypto import Identity
from p2prl.net import topic
from p2prl.node.config import NodeConfig
from p2prl.node.genesis import SignedGenesis
from p2prl.node.port import NetPort
from p2prl.node.pump import Handler, Pump
from p2prl.node.status import NodeStatus
from p2prl.proof import MAGIC, SKETCH_DIM, BatchLimits
from p2prl.protocol import BlobRef, GenerationSpec, Genesis, encode_message
from p2prl.store import BlobStore

log = logging.getLogger(__name__)


class NodeStartError(Exception):
    """The node cannot start (bad genesis, pinned to another network, key file problem, ...)."""


@dataclass
class NodeContext:
    config: NodeConfig
    genesis: SignedGenesis
    identity: Identity
    store: BlobStore
    net: NetPort  # p2prl.net.node.P2PNode when started by build_context
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

    def join(self, timeout: float = 30.0, warn: bool = True) -> bool:
        """Wait for the role's threads; True if all stopped (``warn``: log each that did not)."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive() and warn:
                log.warning("thread %s did not stop in time", t.name)
        return not any(t.is_alive() for t in self.threads)


def rollout_blob_bound(generation: GenerationSpec) -> int:
    """The largest rollout batch blob an honest miner can make under genesis' generation settings.

    The layout of p2prl/proof/batch.py, at its most: a 77-byte header; per group 16 bytes and at
    most 4,096 prompt token ids of 4 bytes; per rollout 12 bytes and, per completion token, an id
    (4), a behaviour logprob (4) and a sketch (SKETCH_DIM); capped at the decoder's 64 MiB bound,
    plus zstd's worst-case growth of incompressible input.
    """
    lim = BatchLimits()
    groups = min(generation.groups_per_batch, lim.max_groups)
    per_group = min(generation.group_size, lim.max_rollouts_per_group)
    tokens = min(generation.max_new_tokens, lim.max_completion_tokens)
    rollout = 12 + tokens * (8 + SKETCH_DIM)
    raw = 77 + groups * (16 + 4 * lim.max_prompt_tokens + per_group * rollout)
    raw = min(raw, lim.max_decoded_bytes)
    return len(MAGIC) + raw + raw // 128 + 1024
