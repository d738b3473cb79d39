"""Two miners, each behind its own NAT router, and a public relay: the miners reserve relay slots,
advertise relayed addresses, reach each other through the relay, punch a direct connection
(DCUtR; the routers drop unsolicited packets silently, like home routers), and get every patch,
with only control traffic on the relay."""

from __future__ import annotations

import secrets

import pytest

from p2prl.bench.nat import run_nat
from p2prl.testbed import list_namespaces

pytestmark = pytest.mark.testbed


@pytest.mark.slow
def test_two_nated_miners_relay_hole_punch_and_patches(nat_ok: None) -> None:
    tag = "nr" + secrets.token_hex(2)
    res = run_nat(miners=2, patches=2, size_kib=1024, link_mbit=40, tag=tag)
    assert list_namespaces(f"p2tb-{tag}-") == []
    assert res["relayed_addrs"] and res["relayed_dials_ok"] == 1, res
    assert res["hole_punched"] == 1 and res["relay_only_pairs"] == 0, res  # relayed leg closed
    assert res["patches_ok"] == res["patches_expected"] == 4, res
    assert 0 < res["relay_bytes_total"] < 64 * 1024, res  # handshakes and gossip, no chunks
    for m in res["miner"]:
        assert m["link_bytes_patches"] >= 2 * 1024 * 1024  # both patches came over the link
        assert 0 < m["relay_share"] < 0.05, m
