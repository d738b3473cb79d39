"""The testbed itself: links are rate-limited, NATed hosts take no inbound connections, and a run
killed in any way leaves no namespace, link, rule or process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from p2prl.testbed.bed import HostSpec, Testbed, hosts_spec
from p2prl.testbed.netns import PREFIX, list_namespaces

pytestmark = pytest.mark.testbed

SINK = "import socket;s=socket.socket();s.bind(('0.0.0.0',5000));s.listen();c,a=s.accept();print(a[0])"


def _connect(tb: Testbed, src: str, ip: str, port: int) -> subprocess.CompletedProcess[str]:
    code = f"import socket;socket.create_connection(('{ip}',{port}),timeout=2)"
    return tb.run(src, [sys.executable, "-c", code])


def test_nat_host_dials_out_and_takes_no_inbound(nat_ok: None, make_testbed: Callable[..., Testbed]) -> None:
    tb = make_testbed(hosts_spec(2, nat=1))
    pub, natted = tb.hosts["h0"], tb.hosts["h1"]
    sink = tb.popen("h0", [sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    assert _connect(tb, "h1", pub.ip, 5000).returncode == 0
    # the public side sees the router's address, not the host's own
    assert sink.communicate(timeout=10)[0].strip() == natted.router_ip
    sink = tb.popen("h1", [sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    try:
        assert _connect(tb, "h0", natted.router_ip or "", 5000).returncode != 0  # no port forwarding
        assert _connect(tb, "h0", natted.ip, 5000).returncode != 0  # private range: not routed
    finally:
        sink.kill()
        sink.wait()


def test_upload_is_rate_limited(make_testbed: Callable[..., Testbed]) -> None:
    tb = make_testbed([HostSpec("a", up_mbit=8), HostSpec("b")])
    recv = "import socket,time;s=socket.socket();s.bind(('0.0.0.0',5000));s.listen();c,_=s.accept()\nwhile c.recv(65536): pass"
    sink = tb.popen("b", [sys.executable, "-c", recv])
    time.sleep(0.3)
    send = (
        f"import socket;s=socket.create_connection(('{tb.hosts['b'].ip}',5000));s.sendall(bytes(2_000_000))"
    )
    t0 = time.monotonic()
    assert tb.run("a", [sys.executable, "-c", send]).returncode == 0
    sink.wait(10)
    secs = time.monotonic() - t0
    assert 1.5 < secs < 4.0, secs  # 16 Mbit at 8 Mbit/s: 2 s
    assert tb.link_bytes("a")["up"] >= 2_000_000


def _run_cli(*args: str) -> tuple[subprocess.Popen[str], str]:
    """Starts ``p2prl testbed run``; returns it with its tag once its hosts are up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2prl", "testbed", "run", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("{"), line
    err = proc.stderr
    proc.stderr_lines = []  # type: ignore[attr-defined]
    # keep reading: a child blocked on a full stderr pipe could not exit
    threading.Thread(target=lambda: proc.stderr_lines.extend(err), daemon=True).start()  # type: ignore[attr-defined]
    return proc, json.loads(line)["tag"]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(tag: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while list_namespaces(f"{PREFIX}{tag}-") and time.monotonic() < deadline:
        time.sleep(0.2)
    return not list_namespaces(f"{PREFIX}{tag}-")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_leaves_nothing(nat_ok: None, sig: signal.Signals) -> None:
    proc, tag = _run_cli("--hosts", "3", "--nat", "1", "--", "sleep", "60")
    namespaces = list_namespaces(f"{PREFIX}{tag}-")
    assert len(namespaces) == 5  # core, 3 hosts, 1 router
    deadline = time.monotonic() + 20  # the hosts are up when the tag is printed; their commands follow
    while True:
        sleepers = [int(p) for ns in namespaces for p in subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]  # fmt: skip
        if len(sleepers) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(sleepers) == 3
    proc.send_signal(sig)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("no exit after the signal: " + "".join(proc.stderr_lines)[-3000:]) from None  # type: ignore[attr-defined]
    assert _gone(tag), list_namespaces(f"{PREFIX}{tag}-")
    for pid in sleepers:  # the processes inside the hosts are stopped too
        assert not _running(pid), pid


def test_failed_setup_cleans_up(namespaces_ok: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from p2prl.testbed import netns

    real_shape = netns.shape

    def shape(ns: str, dev: str, mbit: float) -> None:
        if ns.endswith("-bad"):
            raise netns.TestbedError("injected failure")
        real_shape(ns, dev, mbit)

    monkeypatch.setattr(netns, "shape", shape)
    tb = Testbed([HostSpec("ok", up_mbit=10), HostSpec("bad", up_mbit=10)])
    with pytest.raises(netns.TestbedError, match="injected"):
        tb.up()
    assert tb.namespaces() == []
