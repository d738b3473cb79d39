"""Churn on rate-limited links: a peer killed in the middle of a download comes back with the same
key and store, fetches only the chunks it lacked, and never serves or uses a partial blob as whole."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from p2prl.bench.peerproc import PeerProcess, blob_bytes
from p2prl.protocol.blobs import blob_ref_for
from p2prl.testbed.bed import Testbed, hosts_spec

pytestmark = pytest.mark.testbed

SIZE = 4 * 1024 * 1024
CHUNK = 256 * 1024


def _written(part: Path) -> int:
    try:
        return part.stat().st_blocks * 512  # a sparse file: blocks hold the chunks written so far
    except OSError:
        return 0


def test_killed_peer_resumes(
    namespaces_ok: None,
    make_testbed: Callable[..., Testbed],
    peer_on: Callable[..., PeerProcess],
    tmp_path: Path,
) -> None:
    tb = make_testbed(hosts_spec(2, up_mbit=16, down_mbit=16))  # 4 MiB: about 2 s a transfer
    pub = peer_on(tb, "h0")
    pub.call("put", 5, SIZE)
    ref = blob_ref_for(blob_bytes(5, SIZE), CHUNK)
    peer = peer_on(tb, "h1", store="miner")
    peer.call("connect", pub.addrs)
    peer.send("fetch", ref.to_body(), 60)
    part = tmp_path / "miner" / "partial" / f"{ref.digest}.part"  # partials are keyed by the whole ref
    deadline = time.monotonic() + 30
    while _written(part) < SIZE // 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    peer.kill()  # SIGKILL part-way: the partial file stays in its store
    assert SIZE // 4 <= _written(part) < SIZE + CHUNK, _written(part)
    again = peer_on(tb, "h1", store="miner", seed=peer.identity.seed)
    again.call("connect", pub.addrs)
    r = again.call("fetch", ref.to_body(), 60, timeout=90)
    assert r["ok"] and r["sha256_ok"], r
    down = again.call("stats")["bytes_down"]
    assert 0 < down < SIZE, down  # only the missing chunks came over the link again
