"""The typed door between a role and the node: what a role is given (:class:`RoleEnv`) and what
it gives back (:class:`Role`).

A role never sees the node's configuration, its threads or the network host's administration:
it gets its own settings record (``p2prl.node.setup.settings``), the genesis, its identity, the blob
store, the network as roles use it (:class:`p2prl.node.runtime.port.RolePort`), the status record and the
stop flag. It declares its message handlers, its loops, the blobs it holds and the version it
is on; :class:`p2prl.node.runtime.runtime.NodeRuntime` runs them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar, runtime_checkable

from p2prl.crypto import Identity
from p2prl.net import topic
from p2prl.node.runtime.port import RolePort
from p2prl.node.runtime.pump import Handlers
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.genesis import SignedGenesis
from p2prl.node.setup.settings import RoleSettings
from p2prl.proof import MAGIC, SKETCH_DIM, BatchLimits
from p2prl.protocol import BlobRef, GenerationSpec, Genesis, Message, encode_message
from p2prl.store import BlobStore

log = logging.getLogger(__name__)

S = TypeVar("S", bound=RoleSettings)
Progress = Callable[[int, int], object]


class NodeStartError(Exception):
    """The node cannot start (bad genesis, pinned to another network, key file problem, ...)."""


@runtime_checkable
class Role(Protocol):
    """What the runtime needs of a role; each method is called by the runtime, never by a peer."""

    def handlers(self) -> Handlers:
        """The gossip this role reacts to (run on the pump thread: they only enqueue work)."""
        ...

    def loops(self) -> Mapping[str, Callable[[], None]]:
        """The role's threads by name; each runs until the stop flag is set."""
        ...

    def holds(self) -> list[str]:
        """Blob ids this node serves, told to peers in heartbeats."""
        ...

    def head(self) -> int:
        """The version this role is on, told to peers in heartbeats."""
        ...

    def pause(self) -> None:
        """Stop making new work but keep serving (SIGUSR1; a trainer stops publishing)."""

    def close(self) -> None:
        """Release what the loops used, after they stopped (or their time to stop ran out)."""


@dataclass(frozen=True)
class Outbox:
    """Signed gossip out: a refusal or a stopped host is logged and counted, never raised."""

    identity: Identity
    network_id: str
    net: RolePort
    status: NodeStatus

    def publish(self, kind: str, msg: Message) -> bool:
        try:
            env = encode_message(self.identity, self.network_id, msg)
            self.net.publish(topic(self.network_id, kind), env)
        except Exception as e:  # a publish must never take a role loop down
            self.status.incr_label("publish_failed", type(e).__name__)
            log.warning("publish of %s failed: %s", msg.TYPE, e)
            return False
        return True

    def publish_raw(self, kind: str, envelope: bytes) -> bool:
        """Gossip an envelope signed elsewhere (the trainer's chain signs its manifests)."""
        try:
            self.net.publish(topic(self.network_id, kind), envelope)
        except Exception as e:
            self.status.incr_label("publish_failed", type(e).__name__)
            log.warning("publish on %s failed: %s", kind, e)
            return False
        return True


@dataclass(frozen=True)
class RoleEnv(Generic[S]):
    """Everything a role may use, typed; ``settings`` is the role's own record."""

    settings: S
    genesis: SignedGenesis
    identity: Identity
    store: BlobStore
    net: RolePort
    status: NodeStatus
    stop: threading.Event
    outbox: Outbox

    @property
    def g(self) -> Genesis:
        return self.genesis.genesis

    @property
    def network_id(self) -> str:
        return self.genesis.network_id

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    def publish(self, kind: str, msg: Message) -> bool:
        return self.outbox.publish(kind, msg)

    def publish_raw(self, kind: str, envelope: bytes) -> bool:
        return self.outbox.publish_raw(kind, envelope)

    def fetch_rollouts(
        self, ref: BlobRef, announcer: str, timeout: float, on_progress: Progress | None = None
    ) -> Path:
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
