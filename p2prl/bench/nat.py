"""NATed miners on the testbed: a public relay, miners each behind its own NAT router, patches.

The public node (the trainer's host) runs the relay service; each NATed miner dials it, learns by
dial-back that it cannot be reached, reserves a relay slot and advertises its relayed address.
The miners then dial each other through the relay (gossip and other control traffic may flow
there), DCUtR tries to punch a direct connection, and the trainer publishes patches that every
miner fetches. What comes out: whether every patch arrived, whether and when each pair of miners
got a direct connection, and how much of each miner's traffic went through the relay.

``p2prl testbed nat`` prints it; ``tests/testbed/test_relay.py`` runs it small.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

from p2prl.bench.peerproc import PeerProcess, blob_bytes
from p2prl.protocol import blob_ref_for
from p2prl.testbed import HostSpec, Testbed


def wait_for(pred: Any, timeout: float, every: float = 0.3) -> Any:
    """Poll ``pred()`` until it returns something truthy (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            return got or None
        time.sleep(every)


def run_nat(
    miners: int = 2,
    patches: int = 2,
    size_kib: int = 2048,
    chunk_kib: int = 256,
    link_mbit: float = 40.0,
    hole_punch: bool = True,
    relay: dict[str, int] | None = None,
    punch_wait_s: float = 20.0,
    tag: str | None = None,
) -> dict[str, Any]:
    """Run the scenario; returns the report (see the module docstring)."""
    specs = [HostSpec("relay", link_mbit, link_mbit)] + [
        HostSpec(f"m{i}", link_mbit, link_mbit, nat=f"n{i}") for i in range(miners)
    ]
    size, chunk = size_kib * 1024, chunk_kib * 1024
    out: dict[str, Any] = {"miners": miners, "patches": patches, "patch_bytes": size, "link_mbit": link_mbit}
    tb = Testbed(specs, tag=tag) if tag else Testbed(specs)
    procs: list[PeerProcess] = []
    with tb, tempfile.TemporaryDirectory(prefix="p2prl-nat-") as tmp:

        def start(host: str, **opts: Any) -> PeerProcess:
            h = tb.hosts[host]
            p = PeerProcess(str(Path(tmp) / host), netns=h.ns, listen=h.listen(), wait=False, **opts)
            procs.append(p)
            return p

        try:
            pub = start("relay", superseed=True, relay=relay or {})
            ms = [start(f"m{i}", hole_punch=hole_punch) for i in range(miners)]
            for p in procs:
                p.ready()
            t0 = time.monotonic()
            for m in ms:
                m.call("connect", pub.addrs)
            # each miner: told unreachable by dial-back, then a relay slot and a relayed address
            reach = [wait_for(lambda m=m: _relayed_reach(m), 40.0) for m in ms]
            out["seconds_to_relayed_addr"] = round(time.monotonic() - t0, 2)
            out["relayed_addrs"] = all(reach)
            if not all(reach):
                out["reach"] = [m.call("reach") for m in ms]
                return out
            # miners dial each other through the relay
            pairs = list(itertools.combinations(range(miners), 2))
            dialed = {(i, j): ms[i].call("connect", reach[j]) == 1 for i, j in pairs}
            out["relayed_dials_ok"] = sum(dialed.values())
            t1 = time.monotonic()
            direct = {}
            for i, j in pairs:
                got = wait_for(
                    lambda i=i, j=j: _direct(ms[i], ms[j].peer_id), punch_wait_s if hole_punch else 3.0
                )
                direct[(i, j)] = round(time.monotonic() - t1, 2) if got else None
            out["direct_after_s"] = [direct[p] for p in pairs]
            out["hole_punched"] = sum(v is not None for v in direct.values())
            out["relay_only_pairs"] = sum(_relay_only(ms[i], ms[j].peer_id) for i, j in pairs)
            # patches from the public node reach every miner
            link0 = {h: tb.link_bytes(h) for h in tb.hosts}
            fetched = []
            for k in range(patches):
                pub.call("put", 100 + k, size)
                ref = blob_ref_for(blob_bytes(100 + k, size), chunk)
                for m in ms:
                    m.send("fetch", ref.to_body(), 60)
                fetched += [m.recv(90) for m in ms]
            out["patches_ok"] = sum(1 for r in fetched if r["ok"] and r["sha256_ok"])
            out["patches_expected"] = patches * miners
            out["fetch_errors"] = [r["error"] for r in fetched if not r["ok"]]
            rel = pub.call("relay")
            relay_stats = pub.call("stats")
            stats = [m.call("stats") for m in ms]
            links = {h: tb.link_bytes(h) for h in tb.hosts}
        finally:
            for p in procs:
                p.stop()
    carried = rel["carried"]
    out["miner"] = []
    for m, s, host in zip(ms, stats, (f"m{i}" for i in range(miners)), strict=True):
        total = links[host]["up"] + links[host]["down"]
        via = carried.get(m.peer_id, 0)
        out["miner"].append(
            {
                "link_bytes": total,
                "link_bytes_patches": total - link0[host]["up"] - link0[host]["down"],
                "relayed_bytes": via,
                "relay_share": round(via / total, 5) if total else None,
                "chunk_streams_refused_relayed": s.get("serve.refused_relayed", 0),
                "relay_spare_closed": s.get("relay.spare_closed", 0),
            }
        )
    out["relay_bytes_total"] = sum(carried.values()) // 2  # every relayed byte has two ends
    out["relay_counters"] = {k: v for k, v in relay_stats.items() if k.startswith("relay.")}
    return out


def _relayed_reach(m: PeerProcess) -> list[str] | None:
    ok, addrs = m.call("reach")
    return addrs if ok is False and addrs and all("/p2p-circuit/" in a for a in addrs) else None


def _direct(a: PeerProcess, peer: str) -> bool:
    return False in a.call("relay")["conns"].get(peer, [])


def _relay_only(a: PeerProcess, peer: str) -> bool:
    conns = a.call("relay")["conns"].get(peer, [])
    return bool(conns) and all(conns)
