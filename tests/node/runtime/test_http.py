"""Item 18 of docs/SECURITY.md: idle clients of the status endpoint neither hold a thread each
forever nor grow the thread count without bound."""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time

import pytest

from p2prl.dashboard import fetch_status
from p2prl.node.runtime.http import StatusServer
from p2prl.node.runtime.status import NodeStatus


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


class SilentCrowd:
    """Clients that connect from ``ips`` (loopback aliases), send nothing, and reconnect as soon as
    the server hangs up: the crowd that starved the health check."""

    def __init__(self, port: int, ips: list[str], per_ip: int) -> None:
        self.port, self.stop = port, threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(ip,)) for ip in ips for _ in range(per_ip)]

    def _loop(self, ip: str) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(
                    ("127.0.0.1", self.port), timeout=10, source_address=(ip, 0)
                ) as s:
                    s.recv(1)  # until the server closes it
            except OSError:
                pass
            self.stop.wait(0.01)

    def __enter__(self) -> SilentCrowd:
        for t in self.threads:
            t.start()
        time.sleep(0.5)  # every slot it can take is taken
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def healthz(port: int, source: str) -> bool:
    time.sleep(0.25)  # 20 checks span 5 s: the crowd's slots turn over meanwhile
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=4, source_address=(source, 0))
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.mark.slow
def test_silent_crowd_from_many_addresses_leaves_the_local_health_check() -> None:
    """Item 27: 24 silent clients from 24 addresses, reconnecting at once, held all 16 slots and the
    health check got 1 answer in 20; slots kept for 127.0.0.1 answer every one."""
    server = StatusServer(NodeStatus("miner", "ab" * 32, "net")).start()
    try:
        with SilentCrowd(server.port, [f"127.0.0.{i}" for i in range(2, 26)], 1):
            ok = [healthz(server.port, "127.0.0.1") for _ in range(20)]
        assert all(ok), f"{sum(ok)}/20 health checks answered"
    finally:
        server.stop()


@pytest.mark.slow
def test_silent_crowd_from_one_address_leaves_others_served() -> None:
    """Item 27: 24 silent clients from one address hold at most ``per_ip`` slots: a client from
    another address is served every time."""
    server = StatusServer(NodeStatus("miner", "ab" * 32, "net")).start()
    try:
        with SilentCrowd(server.port, ["127.0.0.2"], 24):
            ok = [healthz(server.port, "127.0.0.3") for _ in range(20)]
        assert all(ok), f"{sum(ok)}/20 requests answered"
    finally:
        server.stop()


def test_a_trickled_request_line_is_cut_off() -> None:
    """A client sending its request line a byte every 0.2 s is dropped about a second after it
    connected (a timeout per read let each byte keep it for another 5 s)."""
    server = StatusServer(NodeStatus("miner", "ab" * 32, "net")).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            t0, cut = time.monotonic(), None
            for b in b"GET /healthz HTTP/1.0\r\nHost: x\r\n":
                if select.select([s], [], [], 0.2)[0]:  # the server answered (408) or hung up
                    cut = time.monotonic() - t0
                    break
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    cut = time.monotonic() - t0
                    break
            assert cut is not None and cut < 2.0, f"still connected after {time.monotonic() - t0:.1f} s"
    finally:
        server.stop()


def health_port_check(port: int) -> bool:
    time.sleep(0.25)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=4)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        return r.status == 200 and r.read() == b"ok\n"
    except OSError:
        return False
    finally:
        conn.close()


@pytest.mark.slow
def test_silent_crowd_on_the_health_checks_own_address(tmp_path) -> None:
    """Issue 32: 24 silent clients from 127.0.0.1 itself (every local client shares it) held the
    local slots and the health check got 0 answers in 20; its own listener (port in health.port),
    crowded the same way as well, answers every one."""
    server = StatusServer(NodeStatus("miner", "ab" * 32, "net")).start(tmp_path)
    try:
        assert server.health is not None
        port = int((tmp_path / "health.port").read_text())
        with SilentCrowd(server.port, ["127.0.0.1"], 24), SilentCrowd(port, ["127.0.0.1"], 24):
            ok = [health_port_check(port) for _ in range(20)]
        assert all(ok), f"{sum(ok)}/20 health checks answered"
    finally:
        server.stop()
