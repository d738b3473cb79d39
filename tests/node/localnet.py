"""An in-process network for role logic: the node's port (``p2prl.node.runtime.port.NetPort``) without sockets.

Every publish goes through the receiving host's real gossip filter (signature, network, topic,
allowed signers, replay), fetches copy bytes from a member that serves the blob into the real
blob store (which checks the hash), and a fetch above ``max_bytes`` is refused as the libp2p host
refuses it. What it leaves out is transport: no streams, no chunking, no loss.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2prl.crypto.keys import Identity
from p2prl.net.config import Limits
from p2prl.net.counters import Counters
from p2prl.net.gossip import GossipFilter, Incoming
from p2prl.net.identity import peer_id_for
from p2prl.net.node import PeerInfo
from p2prl.net.swarm import FetchError
from p2prl.node.run import NodeRuntime
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import SignedGenesis
from p2prl.node.setup.netsettings import allowed_signers
from p2prl.protocol.blobs import BlobRef
from p2prl.store import BlobStore


class LocalHub:
    """The members of one in-process network, with the genesis' rule of who may sign what."""

    def __init__(self, genesis: SignedGenesis) -> None:
        self.genesis = genesis
        self.network_id = genesis.network_id
        self.allowed_signers = allowed_signers(genesis)
        self.members: list[LocalHost] = []

    def join(self, identity: Identity, store: BlobStore) -> LocalHost:
        host = LocalHost(self, identity, store)
        self.members.append(host)
        return host

    def runtime(self, role: str, identity: Identity, data_dir: Path) -> NodeRuntime:
        """A node's runtime on this network (its store under ``data_dir``), as build_runtime makes one."""
        store = BlobStore(data_dir / "blobs")
        return NodeRuntime(
            NodeConfig(role=role, data_dir=data_dir),  # type: ignore[arg-type]
            self.genesis,
            identity,
            store,
            self.join(identity, store),
            NodeStatus(role, identity.public_hex, self.network_id),
        )


class LocalHost:
    def __init__(self, hub: LocalHub, identity: Identity, store: BlobStore) -> None:
        self.hub = hub
        self.identity = identity
        self.store = store
        self.peer_id = peer_id_for(identity)
        self.addrs: list[str] = []
        self.s3: Any = None
        self.counters = Counters()
        self.served: set[str] = set()
        self.hints: dict[str, list[str]] = {}
        self._inbox: collections.deque[Incoming] = collections.deque()
        self._cond = threading.Condition()
        self.filter = GossipFilter(
            hub.network_id, Limits(), self.counters, self._deliver, lambda _p, _r: None, hub.allowed_signers
        )

    def _deliver(self, item: Incoming) -> bool:
        with self._cond:
            self._inbox.append(item)
            self._cond.notify_all()
        return True

    def _others(self) -> list[LocalHost]:
        return [m for m in self.hub.members if m is not self]

    # -- RolePort
    def publish(self, topic: str, envelope: bytes) -> None:
        self.filter.note_own(envelope)
        for m in self._others():
            m.filter.check(topic, envelope, self.peer_id, self.peer_id)

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
        if max_bytes is not None and ref.size > max_bytes:
            raise FetchError(f"blob {ref.id[:16]} of {ref.size} bytes exceeds the bound of {max_bytes}")
        if not self.store.has(ref.id):
            holder = next((m for m in self._others() if ref.id in m.served), None)
            if holder is None:
                raise FetchError(f"nobody serves {ref.id[:16]}")
            self.store.put(holder.store.get(ref.id), expected_id=ref.id)
            if on_progress is not None:
                on_progress(ref.size, ref.size)
        self.served.add(ref.id)
        return self.store.path(ref.id)

    def serve(self, ref: BlobRef) -> None:
        if not self.store.has(ref.id):
            raise FileNotFoundError(f"blob {ref.id[:16]} is not in the store")
        self.served.add(ref.id)

    def add_provider_hint(self, blob_id: str, peer_id: str) -> None:
        self.hints.setdefault(blob_id, []).append(peer_id)

    def add_standing(self, peer_ids: list[str]) -> None:
        pass  # no relay or dialer here

    def has_standing(self, peer_id: str) -> bool:
        return False

    # -- NetPort
    def poll(self, timeout: float = 0.0) -> list[Incoming]:
        with self._cond:
            if not self._inbox:
                self._cond.wait(timeout)
            out = list(self._inbox)
            self._inbox.clear()
        return out

    def peers(self) -> list[PeerInfo]:
        return [PeerInfo(m.peer_id, (), True, False) for m in self._others()]

    def connect(self, addr: str, timeout: float | None = None) -> None:
        pass  # every member reaches every other

    def advertised_addrs(self) -> list[str]:
        return []

    def stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    def running(self) -> bool:
        return True

    def stop(self, timeout: float = 15.0) -> None:
        pass
