"""Checks before a node opens anything: its data directory is its own, its listen port is free.

The libp2p TCP listener sets SO_REUSEPORT (hole punching dials out from the listen port), so a
second node started on a port already in use binds it too and the kernel splits incoming
connections between the two processes; a port held by another program instead makes the listener
fail inside the host's thread while the node runs on unreachable. A plain bind of the same port
(SO_REUSEADDR only, which still refuses while anything listens there) fails in both cases, so the
node refuses to start with one line instead. Two nodes sharing a data directory would overwrite
each other's key-derived state and ``status.port``: an exclusive ``flock`` on ``node.lock`` there,
held for the node's life, keeps the second one out.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "node.lock"


class PreflightError(Exception):
    """The node must not start: one line saying why and what to do."""


class DataDirLock:
    """An exclusive lock on a data directory, held until ``release()`` (or the process ends)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise PreflightError(f"cannot use data directory {self.path.parent}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # a file system without flock (some network mounts): run, but unguarded
                log.warning("cannot lock data directory %s (%s): not guarded against a second node",
                            self.path.parent, e.strerror)  # fmt: skip
                self._fd = fd
                return self
            held_by = _read_pid(fd)
            os.close(fd)
            who = f" (pid {held_by})" if held_by else ""
            raise PreflightError(
                f"data directory {self.path.parent} is in use by another node{who}: "
                "give each node its own --data-dir"
            ) from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def listen_host_port(listen: str) -> tuple[str, int] | None:
    """(host, port) of a ``/ip4|ip6/<host>/tcp/<port>`` multiaddr; None for another form."""
    parts = listen.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp":
        return None
    try:
        return parts[1], int(parts[3])
    except ValueError:
        return None


def check_port_free(host: str, port: int, what: str = "listen") -> None:
    """Raise PreflightError if ``host:port`` (TCP) cannot be bound now; port 0 always passes."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is fine
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PreflightError(
                    f"{what} port {port} is already in use (another node or program listens there): "
                    f"stop it or choose another port"
                ) from e
            raise PreflightError(f"cannot bind {what} address {host}:{port}: {e.strerror or e}") from e


def check_listen(listen: str) -> None:
    """The libp2p listen address's port is free (see the module docstring)."""
    hp = listen_host_port(listen)
    if hp is not None:
        check_port_free(hp[0], hp[1], "listen")
