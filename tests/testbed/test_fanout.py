"""Fan-out on testbed hosts with rate-limited links (one peer behind NAT): every copy verified, the
publisher uploads the blob about once, and one transfer really runs at link speed."""

from __future__ import annotations

import pytest

from p2prl.bench.fanout import run_fanout_testbed

pytestmark = pytest.mark.testbed


def test_fanout_on_rate_limited_links(nat_ok: None) -> None:
    res = run_fanout_testbed(peers=3, size_mib=2, chunk_kib=256, timeout=120, up_mbit=20, down_mbit=20, nat=1)
    assert res["all_verified"], res
    assert res["publisher_upload_ratio"] <= 1.1, res
    assert res["seconds_single"] >= 0.8 * res["seconds_link"], res  # the link, not loopback, sets the pace
    assert res["publisher_link_upload_bytes"] >= res["publisher_upload_bytes"]
