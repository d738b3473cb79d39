"""A node refuses to start on a port in use or a data directory in use: one line, nothing opened."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from p2prl.node.run import start_node
from p2prl.node.runtime.preflight import DataDirLock, PreflightError, check_listen, listen_host_port
from p2prl.node.runtime.role import NodeStartError


def _listener(reuseport: bool) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:  # as libp2p's TCP listener binds: a second SO_REUSEPORT bind would share the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("reuseport", [False, True])
def test_port_in_use_is_refused(reuseport: bool) -> None:
    with _listener(reuseport) as s:
        port = s.getsockname()[1]
        with pytest.raises(PreflightError, match=f"listen port {port} is already in use"):
            check_listen(f"/ip4/127.0.0.1/tcp/{port}")
        with pytest.raises(PreflightError, match="already in use"):
            check_listen(f"/ip4/0.0.0.0/tcp/{port}")  # a wildcard bind conflicts with the loopback one
    check_listen(f"/ip4/127.0.0.1/tcp/{port}")  # free again once closed
    check_listen("/ip4/0.0.0.0/tcp/0")


def test_listen_host_port_parses_tcp_multiaddrs_only() -> None:
    assert listen_host_port("/ip4/0.0.0.0/tcp/4001") == ("0.0.0.0", 4001)
    assert listen_host_port("/ip6/::/tcp/4001") == ("::", 4001)
    assert listen_host_port("/ip4/1.2.3.4/udp/4001/quic") is None


def test_data_dir_lock_is_exclusive_across_processes(tmp_path: Path) -> None:
    lock = DataDirLock(tmp_path / "d").acquire()
    probe = (
        "import sys; from p2prl.node.runtime.preflight import DataDirLock, PreflightError\n"
        "try: DataDirLock(sys.argv[1]).acquire()\n"
        "except PreflightError as e: print(e); sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    r = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "d")], capture_output=True, text=True, env=env
    )
    assert r.returncode == 3, r.stderr
    assert f"in use by another node (pid {os.getpid()})" in r.stdout
    lock.release()
    DataDirLock(tmp_path / "d").acquire().release()  # released: the next node gets it


def test_start_node_refuses_a_held_port_and_a_shared_data_dir(make_net) -> None:
    net = make_net(("trainer", "validator"))
    with _listener(reuseport=True) as s:
        port = s.getsockname()[1]
        with pytest.raises(NodeStartError, match=f"listen port {port} is already in use"):
            start_node(net.config("validator", listen=f"/ip4/127.0.0.1/tcp/{port}"))
        with pytest.raises(NodeStartError, match=f"status port {port} is already in use"):
            start_node(net.config("validator", status_port=port))
    lock = DataDirLock(net.root / "validator").acquire()
    try:
        with pytest.raises(NodeStartError, match="in use by another node"):
            start_node(net.config("validator"))
    finally:
        lock.release()
    assert not (net.root / "validator" / "status.port").exists()


def test_unwritable_data_dir_is_one_line(make_net, tmp_path: Path) -> None:
    net = make_net(("trainer", "validator"))
    (tmp_path / "file").write_text("")  # a path under a file: unwritable for any user, root included
    with pytest.raises(NodeStartError, match=r"cannot use data directory .*file/node"):
        start_node(net.config("validator", data_dir=tmp_path / "file" / "node"))
