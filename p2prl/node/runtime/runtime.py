"""The node's runtime: it owns the threads, the message pump, the network host, the blob store and
the status record, and runs one role through the typed door of ``p2prl.node.runtime.role``.

``p2prl.node.runtime.startup.build_runtime`` turns a NodeConfig into a started runtime; :meth:`NodeRuntime.env`
is all a role is given, and :meth:`NodeRuntime.start` runs what the role declares: its handlers
on the pump thread (verified gossip in, heartbeats out) and its loops on threads of their own.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from p2prl.crypto import Identity
from p2prl.node.runtime.port import NetPort
from p2prl.node.runtime.pump import Pump
from p2prl.node.runtime.role import NodeStartError, Outbox, Role, RoleEnv, S
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import SignedGenesis
from p2prl.node.setup.settings import role_settings
from p2prl.protocol import Message
from p2prl.store import BlobStore

log = logging.getLogger(__name__)

__all__ = ["NodeRuntime", "NodeStartError"]


def disk_full(e: BaseException) -> bool:
    """``e`` (or what caused it) is a write that found the disk full; libraries that write in native
    code (safetensors) raise their own error type with the OS's message."""
    while e is not None:
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


@dataclass
class NodeRuntime:
    config: NodeConfig
    genesis: SignedGenesis
    identity: Identity
    store: BlobStore
    net: NetPort  # p2prl.net.node.P2PNode when started by build_runtime
    status: NodeStatus
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)  # threads that died: the node exits non-zero

    @property
    def outbox(self) -> Outbox:
        return Outbox(self.identity, self.genesis.network_id, self.net, self.status)

    def env(self, kind: type[S]) -> RoleEnv[S]:
        """The role's door: its settings record (``kind``, which must be this node's role's), the
        genesis, identity, store, network port, status and stop flag."""
        settings = role_settings(self.config)
        if not isinstance(settings, kind):
            raise TypeError(f"a {self.config.role} node has {type(settings).__name__}, not {kind.__name__}")
        return RoleEnv(
            settings, self.genesis, self.identity, self.store, self.net, self.status, self.stop, self.outbox
        )

    def publish(self, kind: str, msg: Message) -> bool:
        """Sign and gossip ``msg`` (the pump's heartbeats); see :class:`Outbox`."""
        return self.outbox.publish(kind, msg)

    def start(self, role: Role, only: Collection[str] | None = None) -> None:
        """Run ``role``: the pump with its handlers, then each of its loops on its own thread
        (``only``: just the loops named, for a benchmark that drives the rest itself)."""
        self.spawn("pump", Pump(self, role.handlers(), role.holds, role.head).run)
        for name, loop in role.loops().items():
            if only is None or name in only:
                self.spawn(name, loop)

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a thread that logs (and counts) a crash instead of dying silently, then stops the node."""

        def run() -> None:
            try:
                target()
            except Exception as e:
                if disk_full(e):  # one line that says what to do, not a traceback
                    log.error(
                        "%s: no space left on device (%s): free disk space under %s and restart the node",
                        name, e, self.config.data_dir,
                    )
                else:
                    log.exception("%s thread crashed; stopping the node", name)
                self.crashed.append(name)
                self.status.incr_label("thread_crash", name)
                self.stop.set()

        t = threading.Thread(target=run, name=f"p2prl-{name}", daemon=True)
        self.threads.append(t)
        t.start()
        return t

    def join(self, timeout: float = 30.0, warn: bool = True) -> bool:
        """Wait for the threads; True if all stopped (``warn``: log each that did not)."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive() and warn:
                log.warning("thread %s did not stop in time", t.name)
        return not any(t.is_alive() for t in self.threads)
