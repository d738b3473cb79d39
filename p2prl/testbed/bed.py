"""A testbed of hosts on this machine: network namespaces with rate-limited links and NAT routers.

Layout (all inside namespaces named ``p2tb-<tag>-…``; the host's own interfaces are never touched)::

    p2tb-<tag>-core      bridge br0: the "internet", 10.77.0.0/24
    p2tb-<tag>-<host>    eth0 10.77.0.N on br0 (public), or 10.77.K.N behind router K
    p2tb-<tag>-nat<K>    wan 10.77.0.K on br0, bridge lan 10.77.K.1/24; nftables masquerade out of
                         wan, nothing forwarded in unless it belongs to a connection from inside, and
                         unsolicited packets to the router are dropped silently (like a home router)

A host's upload is shaped on its own eth0, its download on the other end of its veth (tbf on the
egress of both ends). Tear-down deletes the namespaces, which takes their links, queues and NAT
rules with them; ``reaper`` does it when the owning process dies without cleaning up (SIGKILL).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from p2prl.testbed import netns
from p2prl.testbed.netns import PREFIX, TestbedError, ns_ip, sh

SUBNET = "10.77"
_NFT = """table ip p2tb {
  chain masq {
    type nat hook postrouting priority 100;
    oifname "wan" masquerade
  }
  chain forwarding {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }
  chain incoming {
    type filter hook input priority 0; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" drop
  }
}
"""


@dataclass
class HostSpec:
    name: str
    up_mbit: float = 0.0  # 0 = no limit
    down_mbit: float = 0.0
    nat: str | None = None  # hosts naming the same NAT share one router


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    up_mbit: float
    down_mbit: float
    nat: str | None = None
    router_ip: str | None = None  # the address the rest of the testbed sees for a NATed host

    def listen(self, port: int = 0) -> str:
        return f"/ip4/{self.ip}/tcp/{port}"


@dataclass
class Testbed:
    specs: list[HostSpec]
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    _reaper: subprocess.Popen[bytes] | None = None
    __test__ = False  # not a pytest class

    @property
    def core(self) -> str:
        return f"{PREFIX}{self.tag}-core"

    def namespaces(self) -> list[str]:
        return netns.list_namespaces(f"{PREFIX}{self.tag}-")

    # ---------------------------------------------------------------- set-up / tear-down

    def up(self, reaper: bool = True) -> Testbed:
        """Create everything; on any failure tear down what exists and re-raise."""
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names) or not all(n.isalnum() and len(n) <= 12 for n in names):
            raise TestbedError(f"host names must be unique, alphanumeric, at most 12 characters: {names}")
        if reaper:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "p2prl.testbed.reaper", self.tag],
                stdin=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in a terminal must not kill it before us
            )
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        sh("ip", "netns", "add", self.core)
        ns_ip(self.core, "link", "set", "lo", "up")
        ns_ip(self.core, "link", "add", "br0", "type", "bridge")
        ns_ip(self.core, "link", "set", "br0", "up")
        routers: dict[str, tuple[str, int]] = {}
        public_n = 10
        lan_n: dict[str, int] = {}
        for i, spec in enumerate(self.specs):
            ns = f"{PREFIX}{self.tag}-{spec.name}"
            sh("ip", "netns", "add", ns)
            ns_ip(ns, "link", "set", "lo", "up")
            if spec.nat is None:
                ip, upstream, bridge, router_ip = f"{SUBNET}.0.{public_n}", self.core, "br0", None
                public_n += 1
            else:
                if spec.nat not in routers:
                    routers[spec.nat] = (self._router(len(routers) + 1), len(routers) + 1)
                upstream, k = routers[spec.nat]
                lan_n[spec.nat] = lan_n.get(spec.nat, 9) + 1
                ip, bridge, router_ip = f"{SUBNET}.{k}.{lan_n[spec.nat]}", "lan", f"{SUBNET}.0.{k}"
            peer_end = f"h{i}"
            ns_ip(upstream, "link", "add", peer_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ns_ip(upstream, "link", "set", peer_end, "master", bridge, "up")
            plen = 24
            ns_ip(ns, "addr", "add", f"{ip}/{plen}", "dev", "eth0")
            ns_ip(ns, "link", "set", "eth0", "up")
            if router_ip is not None:
                ns_ip(ns, "route", "add", "default", "via", ip.rsplit(".", 1)[0] + ".1")
            if spec.up_mbit > 0:
                netns.shape(ns, "eth0", spec.up_mbit)
            if spec.down_mbit > 0:
                netns.shape(upstream, peer_end, spec.down_mbit)
            self.hosts[spec.name] = Host(spec.name, ns, ip, spec.up_mbit, spec.down_mbit, spec.nat, router_ip)

    def _router(self, k: int) -> str:
        ns = f"{PREFIX}{self.tag}-nat{k}"
        sh("ip", "netns", "add", ns)
        ns_ip(ns, "link", "set", "lo", "up")
        ns_ip(self.core, "link", "add", f"r{k}", "type", "veth", "peer", "name", "wan", "netns", ns)
        ns_ip(self.core, "link", "set", f"r{k}", "master", "br0", "up")
        ns_ip(ns, "addr", "add", f"{SUBNET}.0.{k}/24", "dev", "wan")
        ns_ip(ns, "link", "set", "wan", "up")
        ns_ip(ns, "link", "add", "lan", "type", "bridge")
        ns_ip(ns, "addr", "add", f"{SUBNET}.{k}.1/24", "dev", "lan")
        ns_ip(ns, "link", "set", "lan", "up")
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=_NFT)
        return ns

    def down(self) -> None:
        """Stop every process in the testbed's namespaces and delete them (idempotent)."""
        for ns in self.namespaces():
            netns.delete_namespace(ns)
        self.hosts.clear()
        if self._reaper is not None:
            try:
                self._reaper.stdin.close()  # type: ignore[union-attr]  # EOF: it finds nothing left
            except OSError:
                pass
            self._reaper.wait(10)
            self._reaper = None

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---------------------------------------------------------------- use

    def popen(self, host: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start a real process inside ``host`` (``ip netns exec``)."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[host].ns, *argv], **kw)

    def run(self, host: str, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def link_bytes(self, host: str) -> dict[str, int]:
        """Bytes sent (up) and received (down) on the host's link: what its uplink really carried."""
        info = json.loads(ns_ip(self.hosts[host].ns, "-s", "-j", "link", "show", "eth0"))[0]["stats64"]
        return {"up": int(info["tx"]["bytes"]), "down": int(info["rx"]["bytes"])}

    def describe(self) -> dict[str, Any]:
        return {"tag": self.tag, "hosts": [asdict(h) for h in self.hosts.values()]}


def hosts_spec(n: int, nat: int = 0, up_mbit: float = 0.0, down_mbit: float = 0.0) -> list[HostSpec]:
    """``n`` hosts ``h0…``, the last ``nat`` of them each behind its own NAT router."""
    return [HostSpec(f"h{i}", up_mbit, down_mbit, nat=f"n{i}" if i >= n - nat else None) for i in range(n)]


def down_all(tag: str | None = None) -> list[str]:
    """Remove every testbed namespace (of one tag, or all of them): recovery after a crash."""
    gone = netns.list_namespaces(f"{PREFIX}{tag}-" if tag else PREFIX)
    for ns in gone:
        netns.delete_namespace(ns)
    return gone
