"""A miner behind a NAT (no inbound connections): it dials out, gets every patch, its rollouts reach
the public side over the connection it opened, and dial-back tells it (and only it) that it cannot
be reached, so it advertises no address."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from p2prl.bench.peerproc import PeerProcess, blob_bytes
from p2prl.protocol.blobs import blob_ref_for
from p2prl.testbed.bed import Testbed, hosts_spec

pytestmark = pytest.mark.testbed

SIZE = 3 * 1024 * 1024 + 17
CHUNK = 256 * 1024


def _wait_reach(p: PeerProcess, timeout: float = 30.0) -> tuple[bool | None, list[str]]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        reach = p.call("reach")
        if reach[0] is not None or time.monotonic() > deadline:
            return reach
        time.sleep(0.3)


def test_natted_miner_syncs_and_serves_rollouts(
    nat_ok: None, make_testbed: Callable[..., Testbed], peer_on: Callable[..., PeerProcess]
) -> None:
    tb = make_testbed(hosts_spec(3, nat=1, up_mbit=40, down_mbit=40))  # h0 trainer, h1 validator, h2 NAT
    trainer = peer_on(tb, "h0", superseed=True)
    validator = peer_on(tb, "h1")
    miner = peer_on(tb, "h2")
    validator.call("connect", trainer.addrs)
    assert trainer.call("connect", miner.addrs) == 0  # nobody can dial the miner
    assert miner.call("connect", [*trainer.addrs, *validator.addrs]) == 2

    # reachability by dial-back: the public nodes learn their address, the NATed miner learns it has none
    ok, addrs = _wait_reach(trainer)
    assert ok is True and addrs and tb.hosts["h0"].ip in addrs[0]
    ok, addrs = _wait_reach(miner)
    assert ok is False and addrs == []

    # patches: two versions published by the trainer reach the miner (and the validator)
    for seed in (1, 2):
        trainer.call("put", seed, SIZE)
        ref = blob_ref_for(blob_bytes(seed, SIZE), CHUNK)
        for p in (miner, validator):
            r = p.call("fetch", ref.to_body(), 60, timeout=90)
            assert r["ok"] and r["sha256_ok"], r
    # a rollout batch made by the miner reaches the validator and the trainer over its own connections
    miner.call("put", 9, SIZE)
    ref = blob_ref_for(blob_bytes(9, SIZE), CHUNK)
    for p in (validator, trainer):
        p.call("hint", ref.id, miner.peer_id)
        r = p.call("fetch", ref.to_body(), 60, timeout=90)
        assert r["ok"] and r["sha256_ok"], r
