"""Dashboard rendering from status snapshots (pure functions) and polling real endpoints."""

from rich.console import Console

from p2prl.dashboard.live import poll
from p2prl.dashboard.view import render, reward_series, sparkline
from p2prl.node.http import StatusServer
from p2prl.node.status import NodeStatus


def node(role: str, key: str, version: int) -> NodeStatus:
    s = NodeStatus(role, key * 32, "net")
    s.set(version=version, trainer_version=7, peers=2, sync_state="synced" if version == 7 else "fetching")
    return s


def text_of(renderable: object) -> str:
    c = Console(record=True, width=160)
    c.print(renderable)
    return c.export_text()


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 1]) == "▁█"
    assert len(sparkline(list(range(100)), width=10)) == 10
    assert sparkline([3, 3, 3]) == "▁▁▁"


def test_render_network() -> None:
    t = node("trainer", "aa", 7)
    t.add_reward(1, 1.0, 10)
    t.add_reward(7, 6.0, 10)
    m = node("miner", "bb", 5)
    m.incr("groups_produced", 40)
    m.gauge("patch_last_bytes", 2048)
    m.gauge("patch_apply_ms", 3)
    m.gauge("net_bytes_down", 3 * 1024 * 1024)
    m.gauge("net_bytes_s3", 5 * 1024)
    t.gauge("net_bytes_up", 7 * 1024 * 1024)
    m.transfer("cc" * 32, 50, 100)
    v = node("validator", "dd", 7)
    v.incr("groups_accepted", 30)
    v.incr("groups_rejected", 10)
    v.incr_label("rejected", "fingerprint", 10)
    v.set_scores({"bb" * 32: 30, "ee" * 32: 0})
    snaps = [
        ("http://127.0.0.1:1", t.snapshot(), ""),
        ("http://127.0.0.1:2", m.snapshot(), ""),
        ("http://127.0.0.1:3", v.snapshot(), ""),
        ("http://127.0.0.1:4", None, "refused"),
    ]
    out = text_of(render(snaps))
    assert "trainer at version 7" in out
    assert "2.0K" in out and "3 ms" in out
    assert "3.0M+5.0KS3" in out and "7.0M" in out  # down from peers + S3; the trainer's upload
    assert "fingerprint" in out and "bbbbbbbbbbbbbbbb" in out
    assert "first 1 versions: 0.100  →  last 1: 0.600" in out and "v1–v7, 2 versions" in out
    assert "unreachable" in out
    assert "50% of 100 B" in out
    assert reward_series([t.snapshot(), m.snapshot()]) == [(1, 0.1, 10), (7, 0.6, 10)]


def test_render_empty() -> None:
    assert "no rewards recorded yet" in text_of(render([]))


def test_poll_real_endpoints() -> None:
    s = node("miner", "bb", 3)
    server = StatusServer(s).start()
    try:
        res = poll([server.url, "http://127.0.0.1:1"])
        assert res[0][1] is not None and res[0][1]["version"] == 3
        assert res[1][1] is None and res[1][2]
    finally:
        server.stop()


def test_reward_history_is_bucketed_and_weighted() -> None:
    from p2prl.dashboard.view import SPARK_WIDTH, smoothed

    series = [(v, float(v), 1) for v in range(200)]
    buckets = smoothed(series)
    assert len(buckets) == SPARK_WIDTH and buckets == sorted(buckets)
    assert buckets[0] < 5 and buckets[-1] > 195  # the whole history, oldest first
    assert smoothed([(0, 0.0, 3), (1, 1.0, 1)], width=1) == [0.25]
