"""Fan-out benchmark: one publisher, N peers in separate processes, one blob, real libp2p on loopback.

Phase 1 measures one peer-to-peer transfer (one provider) and the same with two providers.
Phase 2 has a superseeding publisher and N peers, all connected to each other, fetch one blob at
once; it reports the publisher's upload bytes and the time until the last peer holds a verified copy.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from p2prl.net.peerproc import PeerProcess, blob_bytes
from p2prl.protocol.blobs import blob_ref_for


def _stop_all(procs: list[PeerProcess]) -> None:
    for p in procs:
        p.stop()


def run_fanout(
    peers: int = 8, size_mib: int = 64, chunk_kib: int = 1024, timeout: float = 600.0
) -> dict[str, Any]:
    size = size_mib * 1024 * 1024
    chunk = chunk_kib * 1024
    out: dict[str, Any] = {"peers": peers, "blob_bytes": size, "chunk_bytes": chunk}
    with tempfile.TemporaryDirectory(prefix="p2prl-fanout-") as tmp:
        root = Path(tmp)
        # phase 1: one provider, then two
        procs: list[PeerProcess] = []
        try:
            a, b, x = (PeerProcess(str(root / n)) for n in ("a", "b", "x"))
            procs = [a, b, x]
            ref1 = blob_ref_for(blob_bytes(1, size), chunk)
            ref2 = blob_ref_for(blob_bytes(2, size), chunk)
            for p in (a, b):
                p.call("put", 1, size)
                p.call("put", 2, size)
            x.call("connect", a.addrs)
            r1 = x.call("fetch", ref1.to_body(), timeout, timeout=timeout + 30)
            x.call("connect", b.addrs)
            r2 = x.call("fetch", ref2.to_body(), timeout, timeout=timeout + 30)
        finally:
            _stop_all(procs)
        if not (r1["ok"] and r2["ok"]):
            raise RuntimeError(f"throughput phase failed: {r1['error']} {r2['error']}")
        out["seconds_single"] = round(r1["seconds"], 3)
        out["single_provider_MBps"] = round(size / r1["seconds"] / 1e6, 1)
        out["two_providers_MBps"] = round(size / r2["seconds"] / 1e6, 1)

        # phase 2: fan-out to N peers
        procs = []
        try:
            pub = PeerProcess(str(root / "pub"), superseed=True)
            procs.append(pub)
            ref = blob_ref_for(blob_bytes(3, size), chunk)
            pub.call("put", 3, size)
            for i in range(peers):
                p = PeerProcess(str(root / f"p{i}"))
                p.call("connect", [pub.addrs[0], *(q.addrs[0] for q in procs[1:])])
                procs.append(p)
            time.sleep(1.0)  # let identify settle
            up0 = pub.call("stats").get("bytes_up", 0)
            t0 = time.monotonic()
            for p in procs[1:]:
                p.send("fetch", ref.to_body(), timeout)
            results = [p.recv(timeout + 30) for p in procs[1:]]
            wall = time.monotonic() - t0
            up = pub.call("stats").get("bytes_up", 0) - up0
        finally:
            _stop_all(procs)
        errors = [r["error"] for r in results if not r["ok"]]
        out["publisher_upload_bytes"] = up
        out["publisher_upload_ratio"] = round(up / size, 3)
        out["all_verified"] = not errors and all(r["sha256_ok"] for r in results)
        out["seconds_all"] = round(max(r["seconds"] for r in results), 3)
        out["seconds_all_wall"] = round(wall, 3)
        out["all_over_single"] = round(out["seconds_all"] / out["seconds_single"], 2)
        if errors:
            out["errors"] = errors
    return out
