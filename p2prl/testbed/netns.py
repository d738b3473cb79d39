"""Thin wrappers over ``ip``, ``tc`` and ``nft``, and entering a network namespace from Python.

Every command runs as root inside a namespace the testbed created (``ip -n NS``); nothing here
touches the host's own interfaces, so no testbed traffic can leave the machine.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time

PREFIX = "p2tb-"  # every namespace the testbed creates; ``down --all`` removes exactly these
CLONE_NEWNET = 0x40000000


class TestbedError(RuntimeError):
    """A namespace, link, queue or NAT rule could not be set up."""


def sh(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    """Run one command; raise ``TestbedError`` with its stderr when it fails."""
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def ns_ip(ns: str, *args: str) -> str:
    return sh("ip", "-n", ns, *args)


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    out = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (None when they can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc, nftables)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (iproute2)"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        sh("ip", "netns", "add", probe)
    except TestbedError as e:
        return f"cannot create a network namespace: {e}"
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


def nat_unavailable_reason() -> str | None:
    if shutil.which("nft") is None:
        return "'nft' is not installed (apt-get install -y nftables): NAT routers need it"
    return unavailable_reason()


def delete_namespace(ns: str, grace_s: float = 3.0) -> None:
    """Stop every process inside ``ns`` (TERM, then KILL) and delete it with all its links/rules."""
    pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        if not pids:
            break
    sh("ip", "netns", "del", ns, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone: its namespace reference is released
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def enter(ns: str) -> None:
    """Move the calling (single-threaded) process into namespace ``ns``, as ``ip netns exec`` does."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise TestbedError(f"setns {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def shape(ns: str, dev: str, mbit: float) -> None:
    """Limit what leaves ``dev`` to ``mbit`` (tbf: a token bucket; netem is not available here).

    Shaping the egress of both ends of a veth pair gives a host its upload and its download limit
    without an ifb device. The burst covers a 64 KiB GSO packet, the queue 50 ms of traffic.
    """
    rate_bytes = mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes * 0.004))
    sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
       "rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms")  # fmt: skip
