"""``p2prl node``: build the runtime, start the role and the status endpoint, run until a signal.

SIGINT/SIGTERM stop the node cleanly (threads finish their step, the host shuts down, state is on
disk; a miner's or validator's threads get ``FINISH_STEP_S``, then the host stops under them, so a
fetch from a peer that is gone ends at once). Before anything starts, the data directory is locked
and the ports checked (``p2prl.node.runtime.preflight``). SIGUSR1 asks a trainer to stop publishing new
versions while it keeps serving (the demo uses it to let miners catch up before it reads the final
state).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from p2prl.node.runtime.http import StatusServer
from p2prl.node.runtime.preflight import DataDirLock, PreflightError, check_listen, check_port_free
from p2prl.node.runtime.role import NodeStartError, Role
from p2prl.node.runtime.runtime import NodeRuntime
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.settings import MinerSettings, TrainerSettings, ValidatorSettings

log = logging.getLogger(__name__)

__all__ = ["NodeStartError", "RunningNode", "run_node", "start_node"]

FINISH_STEP_S = 5.0  # how long a stopping node's threads get before the host stops under them


RoleFactory = Callable[[NodeRuntime], Role]


class RunningNode:
    """A started node (runtime, role, status server); ``close()`` stops all of it."""

    def __init__(
        self, rt: NodeRuntime, role: Role, server: StatusServer | None, lock: DataDirLock | None = None
    ) -> None:
        self.rt = rt
        self.role = role
        self.server = server
        self.lock = lock

    @property
    def status_url(self) -> str | None:
        return self.server.url if self.server else None

    def close(self, timeout: float = 30.0) -> None:
        rt = self.rt
        rt.stop.set()
        # threads finish their step; a miner's or validator's one waiting on a peer (a fetch from a
        # trainer already gone) would hold the stop for the whole fetch timeout: after a short wait
        # the host stops under it (not the trainer's: its step ends in a publish and a mirror upload)
        follower = rt.config.role != "trainer"
        if not (follower and rt.join(min(timeout, FINISH_STEP_S), warn=False)):
            if follower:
                log.info("threads still waiting on the network: stopping it first")
                rt.net.stop()
            rt.join(timeout)
        try:
            self.role.close()
        except Exception:
            log.exception("role close failed")
        rt.net.stop()
        if self.server is not None:
            self.server.stop()
        if self.lock is not None:
            self.lock.release()


def make_role(rt: NodeRuntime) -> Role:
    """The node's role; only that role's module is imported (a miner loads no learner)."""
    role = rt.config.role
    if role == "miner":
        from p2prl.node.miner.miner import Miner

        return Miner(rt.env(MinerSettings))
    if role == "validator":
        from p2prl.node.validator.validator import Validator

        return Validator(rt.env(ValidatorSettings))
    from p2prl.node.trainer.trainer import Trainer

    return Trainer(rt.env(TrainerSettings))


def start_node(cfg: NodeConfig, role_factory: RoleFactory = make_role) -> RunningNode:
    """Start a node in this process (what ``p2prl node`` does, minus signal handling); ``role_factory``
    builds the role (a benchmark's adversary replaces it)."""
    cfg.validate()
    lock = _preflight(cfg)
    try:
        if cfg.torch_threads > 0:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        rt = build_runtime(cfg)
    except BaseException:
        lock.release()
        raise
    server = None
    try:
        if cfg.status_port >= 0:
            try:
                server = StatusServer(rt.status, cfg.status_host, cfg.status_port).start(cfg.data_dir)
            except OSError as e:
                raise NodeStartError(
                    f"status port {cfg.status_port} on {cfg.status_host}: {e.strerror or e} "
                    "(--status-port 0 picks a free one)"
                ) from e
        role = role_factory(rt)
        rt.start(role)
    except BaseException:
        rt.stop.set()
        rt.join(10)
        rt.net.stop()
        if server is not None:
            server.stop()
        lock.release()
        raise
    log.info(
        "%s %s up: peer %s, addrs %s, status %s",
        cfg.role,
        rt.identity.public_hex[:16],
        rt.net.peer_id,
        rt.net.addrs,
        server.url if server else "off",
    )
    return RunningNode(rt, role, server, lock)


def _preflight(cfg: NodeConfig) -> DataDirLock:
    """Lock the data directory and check the ports before anything is opened (NodeStartError)."""
    try:
        lock = DataDirLock(cfg.data_dir).acquire()
    except PreflightError as e:
        raise NodeStartError(str(e)) from e
    try:
        check_listen(cfg.listen)
        if cfg.status_port > 0:
            check_port_free(cfg.status_host, cfg.status_port, "status")
    except PreflightError as e:
        lock.release()
        raise NodeStartError(str(e)) from e
    return lock


def run_node(cfg: NodeConfig, role_factory: RoleFactory = make_role) -> None:
    """Run until SIGINT/SIGTERM (or a role thread crash); then stop cleanly.

    A trainer under torchrun runs here on rank 0 only; the other ranks serve its sharded learner
    and never open a socket or touch the chain.
    """
    if cfg.role == "trainer":
        from p2prl.rl import distributed

        if distributed.launched() and distributed.rank() != 0:
            # a stop signal reaches every rank; rank 0 finishes its step, publish and checkpoint
            # (collectives that need this rank) and then releases it
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            if cfg.torch_threads > 0:
                import torch

                torch.set_num_threads(cfg.torch_threads)
            distributed.follow()
            return
    node = start_node(cfg, role_factory)
    done = threading.Event()

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        node.rt.stop.set()

    def on_pause(_signum: int, _frame: FrameType | None) -> None:
        node.role.pause()

    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGUSR1, on_pause)
    if node.status_url:
        print(f"status {node.status_url}/status  metrics {node.status_url}/metrics", flush=True)
    died = False
    try:
        while not node.rt.stop.wait(0.5):
            if not node.rt.net.running():  # a dead host would leave a node that only looks alive
                log.error("the network host stopped; exiting so the node can be restarted")
                died = True
                break
    finally:
        node.close()
        done.set()
    log.info("stopped")
    if died or node.rt.crashed:  # a supervisor (systemd, the demo) sees that it failed
        raise SystemExit(1)
