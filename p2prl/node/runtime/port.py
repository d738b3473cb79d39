"""The network as a node uses it: a typed port, so role logic runs against any host that has these.

:class:`p2prl.net.node.P2PNode` (a libp2p host) is the one a node starts; anything in-process with
the same methods can stand in for it, so a role's logic is tested in seconds against real stores,
real signed envelopes and the real gossip checks, without sockets (``tests/node/localnet.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from p2prl.net import DialHost, Incoming, S3Mirror
from p2prl.protocol import BlobRef


@runtime_checkable
class RolePort(Protocol):
    """What the roles use: gossip out, blobs in (from peers, S3 last) and blobs served."""

    s3: S3Mirror | None  # the mirror (a fallback for blobs and manifests)

    def publish(self, topic: str, envelope: bytes) -> None:
        """Gossip a signed envelope on ``topic``; raises if peers would refuse it."""

    def fetch(
        self,
        ref: BlobRef,
        timeout: float = 300.0,
        on_progress: Callable[[int, int], object] | None = None,
        s3: bool = True,
        max_bytes: int | None = None,
        keep_partial: bool = True,
        prefer: Sequence[str] = (),
    ) -> Path:
        """Fetch, verify and store ``ref``; its path in the store (raises when it cannot)."""
        ...

    def serve(self, ref: BlobRef) -> None:
        """Let peers fetch ``ref``, a blob held complete in the store."""

    def add_provider_hint(self, blob_id: str, peer_id: str) -> None:
        """``peer_id`` says it holds ``blob_id``: ask it when fetching."""


@runtime_checkable
class NetPort(RolePort, DialHost, Protocol):
    """What the node adds to the roles' use: the pump's inbox and heartbeat facts, and shutdown."""

    addrs: list[str]

    def poll(self, timeout: float = 0.0) -> list[Incoming]:
        """Verified gossip since the last poll (waits up to ``timeout`` s for the first)."""
        ...

    def advertised_addrs(self) -> list[str]:
        """The addresses to tell peers about in heartbeats."""
        ...

    def add_standing(self, peer_ids: list[str]) -> None:
        """Peers seen in verdicts or scores: a relay makes room for them first, the dialer dials them first."""

    def has_standing(self, peer_id: str) -> bool:
        """Whether ``peer_id`` was seen in verdicts or scores."""
        ...

    def stats(self) -> dict[str, int]:
        """The host's counters (bytes up and down, drops, bans)."""
        ...

    def running(self) -> bool:
        """False once the host has stopped or died: the node then exits rather than stall."""
        ...

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the host down; idempotent."""
