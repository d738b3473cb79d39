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
reserved ones, and from one address at most ``per_ip`` of them.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from p2prl.atomicfile import write_atomic
from p2prl.node.status import NodeStatus, make_registry

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = logging.getLogger(__name__)
PORT_FILE = "status.port"
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
    ) -> None:
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

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self, port_file_dir: Path | None = None) -> StatusServer:
        self._thread.start()
        if port_file_dir is not None:
            p = Path(port_file_dir) / PORT_FILE
            write_atomic(p, f"{self.port}\n".encode())
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
