"""The status endpoint: JSON status, Prometheus metrics from the same record, bounded series."""

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from p2prl.dashboard import fetch_status
from p2prl.node.runtime.http import PORT_FILE, StatusServer
from p2prl.node.runtime.status import MAX_LABELS, MAX_REWARD_SERIES, MAX_SERIES, NodeStatus


@pytest.fixture
def status() -> NodeStatus:
    s = NodeStatus("validator", "ab" * 32, "net")
    s.set(version=5, trainer_version=7, peers=3, sync_state="fetching")
    s.incr("rollouts_accepted", 12)
    s.incr("rollouts_rejected", 4)
    s.incr_label("rejected", "fingerprint", 4)
    s.gauge("patch_apply_ms", 12.5)
    s.set_scores({"cd" * 32: 12, "ef" * 32: 0})
    s.add_reward(1, 2.0, 8)
    s.add_reward(2, 6.0, 8)
    s.record_hash(5, "11" * 32)
    return s


def test_snapshot(status: NodeStatus) -> None:
    snap = status.snapshot()
    assert snap["lag"] == 2
    assert snap["counters"] == {"rollouts_accepted": 12, "rollouts_rejected": 4}
    assert snap["labelled"]["rejected"] == {"fingerprint": 4}
    assert snap["reward_by_version"]["1"] == {"mean": 0.25, "count": 8}
    assert snap["hashes"] == {"5": "11" * 32}
    json.dumps(snap)  # plain JSON


def test_bounds() -> None:
    s = NodeStatus("miner", "ab" * 32, "net")
    for i in range(MAX_LABELS + 10):
        s.incr_label("dropped", f"reason{i}")
    for v in range(MAX_REWARD_SERIES + 10):
        s.add_reward(v, 1.0, 1)
        s.record_hash(v, "00")
    s.add_reward(10**6, 0.0, 0)  # empty: ignored
    snap = s.snapshot()
    assert len(snap["labelled"]["dropped"]) == MAX_LABELS + 1  # plus "other"
    assert snap["labelled"]["dropped"]["other"] == 10
    assert len(snap["reward_by_version"]) == MAX_REWARD_SERIES
    assert min(int(v) for v in snap["reward_by_version"]) == 10
    assert len(snap["hashes"]) == MAX_SERIES
    s.transfer("aa", 5, 10)
    assert s.snapshot()["transfers"] == {"aa": {"done": 5, "total": 10}}
    s.transfer("aa", 10, 10)
    assert s.snapshot()["transfers"] == {}


def test_http_endpoint(status: NodeStatus, tmp_path: Path) -> None:
    server = StatusServer(status, "127.0.0.1", 0).start(tmp_path)
    try:
        assert int((tmp_path / PORT_FILE).read_text()) == server.port
        snap = fetch_status(server.url)
        assert snap["version"] == 5 and snap["role"] == "validator"
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain")
        assert 'p2prl_version{key="abababababababab",role="validator"} 5.0' in text
        assert 'p2prl_rollouts_accepted_total{key="abababababababab",role="validator"} 12.0' in text
        assert (
            'p2prl_rejected_total{key="abababababababab",reason="fingerprint",role="validator"} 4.0' in text
        )
        assert 'p2prl_miner_score{miner="cdcdcdcdcdcdcdcd"} 12.0' in text
        assert "p2prl_reward_mean" in text and " 0.75" in text
        assert "p2prl_sync_lag_versions" in text
        status.incr("rollouts_accepted")
        assert fetch_status(server.url)["counters"]["rollouts_accepted"] == 13
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.url + "/nope", timeout=5)
        with urllib.request.urlopen(server.url + "/healthz", timeout=5) as r:
            assert r.read() == b"ok\n"
    finally:
        server.stop()
    with pytest.raises(OSError):
        fetch_status(server.url, timeout=1)
