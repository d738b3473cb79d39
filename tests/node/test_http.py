"""Item 18 of docs/SECURITY.md: idle clients of the status endpoint neither hold a thread each
forever nor grow the thread count without bound."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from p2prl.dashboard import fetch_status
from p2prl.node.http import StatusServer
from p2prl.node.status import NodeStatus


def handler_threads() -> int:
    return sum(
        1 for t in threading.enumerate() if t.name.startswith("Thread-") and "process_request" in t.name
    )


@pytest.mark.slow
def test_idle_clients_are_bounded_and_dropped() -> None:
    server = StatusServer(NodeStatus("miner", "ab" * 32, "net")).start()
    idle = []
    try:
        for _ in range(64):  # connect and never send a request
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
        time.sleep(0.5)
        assert handler_threads() <= 16
        for s in idle:  # the server hangs up on each of them, none is kept forever
            assert s.recv(1) == b""
        assert fetch_status(server.url)["role"] == "miner"
    finally:
        for s in idle:
            s.close()
        server.stop()
