"""Fan-out benchmark: one publisher, N peers in separate processes, one blob, real libp2p on loopback.

Phase 1 measures one peer-to-peer transfer (one provider) and the same with two providers, first
uncapped, then with each provider's upload capped (as a volunteer's uplink is): on loopback the
receiver's CPU, not the providers, limits an uncapped transfer, so only the capped pair shows what a
second provider adds.
Phase 2 has a superseeding publisher and N peers, all connected to each other, fetch one blob at
once; it reports the publisher's upload bytes and the time until the last peer holds a verified copy.

Both phases also report the CPU seconds the processes spent. A Noise/Yamux transfer in py-libp2p
keeps its receiver near one full core, so on a machine with fewer cores than processes the swarm's
wall time is bounded below by its total CPU divided by the cores: ``cpu_bound_seconds_all`` says how
much of ``seconds_all`` the machine, not the protocol, imposes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2prl.bench.peerproc import PeerProcess, blob_bytes
from p2prl.protocol.blobs import blob_ref_for


def _cpu(procs: list[PeerProcess]) -> list[float]:
    return [float(p.call("cpu")) for p in procs]


def _one_then_two(
    root: Path,
    tag: str,
    seeds: tuple[int, int],
    size: int,
    chunk: int,
    timeout: float,
    hosts: dict[str, dict[str, Any]] | None = None,
    **provider_opts: Any,
) -> tuple[float, float, float]:
    """A peer fetches one blob from one provider, then another blob from two (``provider_opts`` set
    up both providers; ``hosts`` puts "a", "b" and "x" on testbed hosts). Returns the two fetch
    times and the CPU seconds of the one-provider transfer (provider + receiver)."""
    procs: list[PeerProcess] = []
    on = hosts or {}
    try:
        a, b = (PeerProcess(str(root / f"{tag}-{n}"), **provider_opts, **on.get(n, {})) for n in ("a", "b"))
        x = PeerProcess(str(root / f"{tag}-x"), **on.get("x", {}))
        procs = [a, b, x]
        refs = [blob_ref_for(blob_bytes(s, size), chunk) for s in seeds]
        for p in (a, b):
            for s in seeds:
                p.call("put", s, size)
        x.call("connect", a.addrs)
        cpu0 = _cpu([a, x])
        r1 = x.call("fetch", refs[0].to_body(), timeout, timeout=timeout + 30)
        cpu_one = sum(_cpu([a, x])) - sum(cpu0)
        x.call("connect", b.addrs)
        r2 = x.call("fetch", refs[1].to_body(), timeout, timeout=timeout + 30)
    finally:
        _stop_all(procs)
    if not (r1["ok"] and r2["ok"]):
        raise RuntimeError(f"{tag} phase failed: {r1['error']} {r2['error']}")
    return r1["seconds"], r2["seconds"], cpu_one


def _stop_all(procs: list[PeerProcess]) -> None:
    for p in procs:
        p.stop()


def run_fanout(
    peers: int = 8,
    size_mib: int = 64,
    chunk_kib: int = 1024,
    timeout: float = 600.0,
    cap_mb_s: float = 30.0,
) -> dict[str, Any]:
    size = size_mib * 1024 * 1024
    chunk = chunk_kib * 1024
    out: dict[str, Any] = {"peers": peers, "blob_bytes": size, "chunk_bytes": chunk}
    with tempfile.TemporaryDirectory(prefix="p2prl-fanout-") as tmp:
        root = Path(tmp)
        # phase 1: one provider, then two; then the same with capped uploads
        one, two, cpu_single = _one_then_two(root, "throughput", (1, 2), size, chunk, timeout)
        out["seconds_single"] = round(one, 3)
        out["cpu_seconds_single"] = round(cpu_single, 3)
        out["single_provider_MBps"] = round(size / one / 1e6, 1)
        out["two_providers_MBps"] = round(size / two / 1e6, 1)
        one, two, _ = _one_then_two(
            root, "capped", (4, 5), size, chunk, timeout, max_upload_bytes_per_s=cap_mb_s * 1e6
        )
        out["capped_provider_MBps_limit"] = cap_mb_s
        out["capped_single_provider_MBps"] = round(size / one / 1e6, 1)
        out["capped_two_providers_MBps"] = round(size / two / 1e6, 1)
        out["capped_two_over_one"] = round(one / two, 2)

        out.update(_fanout(root, peers, size, chunk, timeout))
    out["all_over_single"] = round(out["seconds_all"] / out["seconds_single"], 2)
    return out


def run_fanout_testbed(
    peers: int = 8,
    size_mib: int = 64,
    chunk_kib: int = 1024,
    timeout: float = 600.0,
    up_mbit: float = 50.0,
    down_mbit: float = 50.0,
    nat: int = 0,
) -> dict[str, Any]:
    """The fan-out benchmark on testbed hosts: the publisher and every peer on its own namespace
    with ``up_mbit``/``down_mbit`` links (the last ``nat`` peers behind NAT routers), so the links,
    not loopback and the CPU, set the pace. ``seconds_link`` is one transfer at link speed."""
    from p2prl.testbed.bed import HostSpec, Testbed

    size = size_mib * 1024 * 1024
    chunk = chunk_kib * 1024
    specs = [HostSpec("pub", up_mbit, down_mbit)] + [
        HostSpec(f"p{i}", up_mbit, down_mbit, nat=f"n{i}" if i >= peers - nat else None) for i in range(peers)
    ]
    out: dict[str, Any] = {"peers": peers, "blob_bytes": size, "chunk_bytes": chunk, "testbed": True}
    out.update(up_mbit=up_mbit, down_mbit=down_mbit, nat_peers=nat)
    out["seconds_link"] = round(size * 8 / (min(up_mbit, down_mbit) * 1e6), 3)
    with Testbed(specs) as tb, tempfile.TemporaryDirectory(prefix="p2prl-fanout-") as tmp:
        root = Path(tmp)
        opts = {n: {"netns": h.ns, "listen": h.listen()} for n, h in tb.hosts.items()}
        # one provider (the publisher's host), then two (plus a public peer's host): one receiver
        one, two, cpu_single = _one_then_two(
            root,
            "link",
            (1, 2),
            size,
            chunk,
            timeout,
            hosts={"a": opts["pub"], "b": opts["p0"], "x": opts["p1"]},
        )
        out["seconds_single"] = round(one, 3)
        out["cpu_seconds_single"] = round(cpu_single, 3)
        out["single_provider_MBps"] = round(size / one / 1e6, 2)
        out["two_providers_MBps"] = round(size / two / 1e6, 2)
        hosts = [opts["pub"]] + [opts[f"p{i}"] for i in range(peers)]
        out.update(_fanout(root, peers, size, chunk, timeout, hosts, lambda: tb.link_bytes("pub")["up"]))
    out["all_over_single"] = round(out["seconds_all"] / out["seconds_single"], 2)
    out["all_over_link"] = round(out["seconds_all"] / out["seconds_link"], 2)
    return out


def _fanout(
    root: Path,
    peers: int,
    size: int,
    chunk: int,
    timeout: float,
    hosts: list[dict[str, Any]] | None = None,
    link_bytes: Callable[[], int] | None = None,
) -> dict[str, Any]:
    """A superseeding publisher and ``peers`` peers, all connected to each other, fetch one blob at
    once (``hosts``: testbed options of the publisher, then of each peer)."""
    on = hosts or [{} for _ in range(peers + 1)]
    out: dict[str, Any] = {}
    procs: list[PeerProcess] = []
    try:
        pub = PeerProcess(str(root / "pub"), superseed=True, **on[0])
        procs.append(pub)
        ref = blob_ref_for(blob_bytes(3, size), chunk)
        pub.call("put", 3, size)
        for i in range(peers):
            procs.append(PeerProcess(str(root / f"p{i}"), wait=False, **on[i + 1]))
        for i, p in enumerate(procs[1:]):
            p.ready()
            p.call("connect", [q.addrs[0] for q in procs[: i + 1]])
        time.sleep(1.0)  # let identify settle
        up0 = pub.call("stats").get("bytes_up", 0)
        link0 = link_bytes() if link_bytes else 0
        cpu0 = _cpu(procs)
        t0 = time.monotonic()
        for p in procs[1:]:
            p.send("fetch", ref.to_body(), timeout)
        results = [p.recv(timeout + 30) for p in procs[1:]]
        wall = time.monotonic() - t0
        up = pub.call("stats").get("bytes_up", 0) - up0
        if link_bytes:
            out["publisher_link_upload_bytes"] = link_bytes() - link0
        cpu_all = [b - a for a, b in zip(cpu0, _cpu(procs), strict=True)]
        stats = [p.call("stats") for p in procs]
    finally:
        _stop_all(procs)
    out["connections_closed_dead"] = sum(s.get("dead_conns_closed", 0) for s in stats)
    errors = [r["error"] for r in results if not r["ok"]]
    out["publisher_upload_bytes"] = up
    out["publisher_upload_ratio"] = round(up / size, 3)
    out["all_verified"] = not errors and all(r["sha256_ok"] for r in results)
    out["seconds_all"] = round(max(r["seconds"] for r in results), 3)
    out["seconds_each"] = sorted(round(r["seconds"], 2) for r in results)
    out["seconds_all_wall"] = round(wall, 3)
    cores = os.cpu_count() or 1
    out["cores"] = cores
    out["cpu_seconds_all"] = round(sum(cpu_all), 3)
    out["cpu_seconds_publisher"] = round(cpu_all[0], 3)
    out["cpu_seconds_peer_max"] = round(max(cpu_all[1:]), 3)
    out["cpu_bound_seconds_all"] = round(sum(cpu_all) / min(cores, len(cpu_all)), 3)
    out["all_over_cpu_bound"] = round(out["seconds_all_wall"] / out["cpu_bound_seconds_all"], 2)
    # cores the swarm really got: on a shared machine other work takes the rest
    out["cores_used"] = round(sum(cpu_all) / wall, 2)
    out["load_average_1min"] = round(os.getloadavg()[0], 1)
    if errors:
        out["errors"] = errors
    return out
