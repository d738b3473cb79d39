"""The local status endpoint: ``GET /status`` (JSON), ``GET /metrics`` (Prometheus), ``GET /healthz``.

Read-only and bound to 127.0.0.1 by default; it runs in its own daemon threads so a slow client never
touches a role loop. At most ``max_clients`` connections are served at once (more are closed at
once) and a client silent for ``idle_timeout_s`` is dropped, so idle sockets cannot pile up threads.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from p2prl.atomicfile import write_atomic
from p2prl.node.status import NodeStatus, make_registry

log = logging.getLogger(__name__)
PORT_FILE = "status.port"


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_clients`` of them; a connection beyond is closed."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: Any, max_clients: int) -> None:
        super().__init__(addr, handler)
        self._slots = threading.BoundedSemaphore(max_clients)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class StatusServer:
    """Serves one NodeStatus over HTTP until ``stop()``."""

    def __init__(
        self,
        status: NodeStatus,
        host: str = "127.0.0.1",
        port: int = 0,
        max_clients: int = 16,
        idle_timeout_s: float = 5.0,
    ) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = make_registry(status)

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_timeout_s  # socket timeout: a silent client is dropped, its thread freed

            def do_GET(self) -> None:
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

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("status %s", format % args)

        self._server = _BoundedHTTPServer((host, port), Handler, max_clients)
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

