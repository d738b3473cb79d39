"""Dashboard rendering from status snapshots (pure functions) and polling real endpoints."""

from rich.console import Console

from p2prl.dashboard.live import poll
from p2prl.dashboard.view import render, reward_series, sparkline
from p2prl.node.runtime.http import StatusServer
from p2prl.node.runtime.status import NodeStatus


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
    # a fixed range: values drawn against it, those outside at its edges
    assert sparkline([0.0, 0.5, 1.0, -1.0, 2.0], lo=0.0, hi=1.0) == "▁▅█▁█"


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


def test_render_fits_80x24() -> None:
    """A demo network (4 nodes, one unreachable) on an 80x24 terminal: one line per node, no wrapping."""
    t = node("trainer", "aa", 7)
    for v in range(8):
        t.add_reward(v, 0.1 * v, 16)
    t.gauge("net_bytes_up", 7 * 1024 * 1024)
    miners = [node("miner", k, 7 - i) for i, k in enumerate(("bb", "cc"))]
    for m in miners:
        m.incr("groups_produced", 400)
        m.gauge("net_bytes_down", 3 * 1024 * 1024)
        m.gauge("net_bytes_s3", 5 * 1024)
    miners[1].transfer("ff" * 32, 50, 100)
    v = node("validator", "dd", 7)
    v.incr("groups_accepted", 12345)
    v.incr("groups_rejected", 678)
    v.incr_label("rejected", "fingerprint", 600)
    v.incr_label("rejected", "distribution_batch", 78)
    v.set_scores({"bb" * 32: 1061, "cc" * 32: 0})
    snaps = [
        ("http://127.0.0.1:41001", t.snapshot(), ""),
        ("http://127.0.0.1:41002", v.snapshot(), ""),
        ("http://127.0.0.1:41003", miners[0].snapshot(), ""),
        ("http://127.0.0.1:41004", miners[1].snapshot(), ""),
        ("http://127.0.0.1:41005", None, "[Errno 111] Connection refused"),
    ]
    c = Console(record=True, width=80, height=24)
    c.print(render(snaps))
    lines = c.export_text().rstrip("\n").splitlines()
    assert len(lines) <= 24, "\n".join(lines)
    assert all(len(ln) <= 80 for ln in lines)
    for key, port, role, version in (("aa", 1, "trainer", 7), ("dd", 2, "validator", 7), ("cc", 4, "miner", 6)):
        row = [ln for ln in lines if f"{key * 4} 4100{port}" in ln]
        assert len(row) == 1 and role in row[0] and f" {version} " in row[0], "\n".join(lines)
    assert any("127.0.0.1:41005" in ln and "unreachable" in ln for ln in lines)
    assert any("12345" in ln and "678" in ln for ln in lines)  # the validator's counts, unwrapped
    assert any("fingerprint" in ln and "600" in ln for ln in lines)
    # the wide layout keeps every column
    assert "produced" in text_of(render(snaps)) and "produced" not in "\n".join(lines)


def test_a_validator_behind_or_calibrating_says_so() -> None:
    """Issue 32: a trainer waiting on a validator that fell behind (or is still calibrating) shows
    why on the dashboard, not a plain "synced"."""
    behind = node("validator", "dd", 7)
    behind.set(judging="behind: 40 queued, oldest 95 s")
    calibrating = node("validator", "ee", 7)
    calibrating.set(calibrating=True, judging="keeping up (calibrating: genesis tolerances)")
    out = text_of(render([("http://127.0.0.1:3", behind.snapshot(), ""), ("http://127.0.0.1:5", calibrating.snapshot(), "")]))
    assert "judging behind" in out and "calibrating" in out
