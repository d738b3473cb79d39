"""The local status endpoint: ``GET /status`` (JSON), ``GET /metrics`` (Prometheus), ``GET /healthz``.

Read-only and bound to 127.0.0.1 by default; it runs in its own daemon threads so a slow client never
touches a role loop. Connections are bounded so that no crowd of clients, from one address or many,
can starve the local health check:

- at most ``max_clients`` connections at once, of which ``local_slots`` only for 127.0.0.1 / ::1
  (the container's health check and a local dashboard); more are closed at once;
- at most ``per_ip`` connections from one address;
- the request line and headers must arrive within ``head_timeout_s`` (about 1 s) in all, however
  slowly they trickle in; a client silent afterwards is dropped after ``idle_timeout_s``.

A loop of silent reconnecting clients therefore holds a slot each for about a second, never the
reserved ones, and from one address at most ``per_ip`` of them. A crowd on the health check's own
address (127.0.0.1, shared by every local client) can still hold those: the health check's own
listener (``HealthServer``, port in ``<data-dir>/health.port``) holds no slot at all.
"""

from __future__ import annotations

import io
import json
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from p2prl.atomicfile import write_atomic
from p2prl.node.runtime.status import NodeStatus, make_registry

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = logging.getLogger(__name__)
PORT_FILE = "status.port"
HEALTH_PORT_FILE = "health.port"
HEALTH_REPLY = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
HEALTH_LINGER_S = 1.0  # a health connection answered is closed after this (or when its client closes)
HEALTH_OPEN_MAX = 256  # answered connections kept open to drain; beyond, the oldest is closed
LOCAL = frozenset({"127.0.0.1", "::1"})
# socketserver's request (a TCP server's is always the socket) and client address ((host, port, …))
Request = socket.socket | tuple[bytes, socket.socket]
Address = tuple[str, int] | tuple[str, int, int, int]


class _DeadlineReader(io.RawIOBase):
    """A socket's read side where every read waits only until one deadline (not a fresh timeout per
    read, which a client sending a byte a second would never reach)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request head too slow")
        self.sock.settimeout(left)
        return self.sock.recv_into(b)


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per admitted connection: ``max_clients`` in all (``local_slots`` of them local
    only), ``per_ip`` per address; a connection beyond is closed at once."""

    daemon_threads = True

    def __init__(
        self,
        addr: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_clients: int,
        local_slots: int,
        per_ip: int,
    ) -> None:
        super().__init__(addr, handler)
        self.max_clients, self.local_slots, self.per_ip = max_clients, local_slots, per_ip
        self._lock = threading.Lock()
        self._active = 0
        self._by_ip: dict[str, int] = {}
        self.refused = 0

    def _admit(self, ip: str) -> bool:
        with self._lock:
            limit = self.max_clients if ip in LOCAL else self.max_clients - self.local_slots
            if self._active >= limit or self._by_ip.get(ip, 0) >= self.per_ip:
                self.refused += 1
                return False
            self._active += 1
            self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
            return True

    def _release(self, ip: str) -> None:
        with self._lock:
            self._active -= 1
            n = self._by_ip.pop(ip, 1) - 1
            if n > 0:
                self._by_ip[ip] = n

    def process_request(self, request: Request, client_address: Address) -> None:
        ip = str(client_address[0])
        if not self._admit(ip):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._release(ip)
            raise

    def process_request_thread(self, request: Request, client_address: Address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))


class StatusServer:
    """Serves one NodeStatus over HTTP until ``stop()``."""

    def __init__(
        self,
        status: NodeStatus,
        host: str = "127.0.0.1",
        port: int = 0,
        max_clients: int = 16,
        idle_timeout_s: float = 5.0,
        head_timeout_s: float = 1.0,
        local_slots: int = 2,
        per_ip: int = 4,
        health_port: int | None = 0,
    ) -> None:
        """``health_port``: the health check's own listener (``HealthServer``) on ``host``; 0 picks a
        free port, None runs none."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = make_registry(status)

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_timeout_s  # socket timeout: a silent client is dropped, its thread freed

            def setup(self) -> None:
                super().setup()
                deadline = time.monotonic() + head_timeout_s  # one request per connection (HTTP/1.0)
                self.rfile.close()  # the per-read-timeout reader the base class made
                self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

            def do_GET(self) -> None:
                self.connection.settimeout(idle_timeout_s)  # the response may take a slow reader longer
                path = self.path.split("?", 1)[0]
                if path == "/status":
                    self._send(200, "application/json", json.dumps(status.snapshot()).encode())
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                elif path == "/healthz":
                    self._send(200, "text/plain", b"ok\n")
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("status %s", format % args)

        self._server = _BoundedHTTPServer((host, port), Handler, max_clients, local_slots, per_ip)
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)
        try:
            self.health = HealthServer(host, health_port) if health_port is not None else None
        except BaseException:
            self._server.server_close()
            raise

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self, port_file_dir: Path | None = None) -> StatusServer:
        self._thread.start()
        if self.health is not None:
            self.health.start(port_file_dir)
        if port_file_dir is not None:
            p = Path(port_file_dir) / PORT_FILE
            write_atomic(p, f"{self.port}\n".encode())
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if self.health is not None:
            self.health.stop()


class HealthServer:
    """A listener whose every connection is answered ``200 ok`` at accept, before anything is read:
    no client can hold it, however many connect from wherever (a slot in ``StatusServer`` can be
    held by a silent client for about a second, and 127.0.0.1 is shared by every local client).

    One thread, one selector: each accepted socket gets the fixed reply (it fits any socket buffer),
    its write side is shut, and it stays open only to drain the client's request (closing a socket
    with unread bytes resets it, which could cut the reply short), at most ``HEALTH_LINGER_S`` and
    ``HEALTH_OPEN_MAX`` of them, oldest closed first. The reply says the process's HTTP thread runs.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.create_server((host, port), backlog=128)
        self._sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._open: OrderedDict[socket.socket, float] = OrderedDict()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-http", daemon=True)
        self.answered = 0

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self._sock.getsockname()[0]}:{self.port}/healthz"

    def start(self, port_file_dir: Path | None = None) -> HealthServer:
        self._thread.start()
        if port_file_dir is not None:
            write_atomic(Path(port_file_dir) / HEALTH_PORT_FILE, f"{self.port}\n".encode())
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in list(self._open):
            self._close(s)
        self._sel.close()
        self._sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.2):
                if key.fileobj is self._sock:
                    self._accept()
                else:
                    self._drain(key.fileobj)  # type: ignore[arg-type]
            cutoff = time.monotonic() - HEALTH_LINGER_S
            while self._open and next(iter(self._open.values())) < cutoff:
                self._close(next(iter(self._open)))

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections, then back to draining
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: the backlog waits
                log.debug("health accept: %s", e)
                return
            try:
                conn.setblocking(False)
                conn.send(HEALTH_REPLY)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                conn.close()
                continue
            self.answered += 1
            if len(self._open) >= HEALTH_OPEN_MAX:
                self._close(next(iter(self._open)))
            self._open[conn] = time.monotonic()
            self._sel.register(conn, selectors.EVENT_READ)

    def _drain(self, conn: socket.socket) -> None:
        try:
            if conn.recv(4096):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._close(conn)  # the client closed (or reset): done

    def _close(self, conn: socket.socket) -> None:
        self._open.pop(conn, None)
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
