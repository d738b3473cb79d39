"""One node's status as a short key/value summary (``p2prl status URL``); pure, so it is testable."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from p2prl.dashboard.view import fmt_bytes, reward_series


def _pairs(d: dict[str, Any], limit: int = 6) -> str:
    """``a 3, b 1`` for the largest values of ``d``, with how many more were left out."""
    items = sorted(d.items(), key=lambda kv: -int(kv[1]))
    text = ", ".join(f"{k[:16]} {int(v)}" for k, v in items[:limit])
    return text + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _uptime(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def status_summary(url: str, s: dict[str, Any]) -> Table:
    """Who the node is, its version against the trainer's, sync, peers, traffic, rollouts, reward."""
    c, g = s.get("counters", {}), s.get("gauges", {})
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    version, tv = int(s.get("version", 0)), int(s.get("trainer_version", 0))
    lag = max(0, tv - version)
    t.add_row("node", f"{s.get('role', '?')} {s.get('key', '')[:16]}… at {url}")
    t.add_row("network", f"{s.get('network_id', '?')}   peer {s.get('peer_id', '') or '-'}")
    t.add_row(
        "version",
        Text(f"{version} (trainer at {tv}, lag {lag})", style="green" if lag == 0 else "yellow"),
    )
    t.add_row("sync", f"{s.get('sync_state', '?')}   weights {str(s.get('weights_hash', ''))[:16] or '-'}")
    t.add_row("peers", f"{int(s.get('peers', 0))}   up {_uptime(float(s.get('uptime_s', 0)))}")
    down = fmt_bytes(g.get("net_bytes_down", 0))
    if g.get("net_bytes_s3"):
        down += f" (+{fmt_bytes(g['net_bytes_s3'])} from S3)"
    t.add_row("traffic", f"up {fmt_bytes(g.get('net_bytes_up', 0))}, down {down}")
    groups = {
        k: int(c[k])
        for k in ("groups_produced", "groups_accepted", "groups_rejected", "groups_consumed")
        if k in c
    }
    if groups:
        t.add_row("groups", ", ".join(f"{k.split('_', 1)[1]} {v}" for k, v in groups.items()))
    if s.get("role") == "trainer":
        t.add_row(
            "trainer",
            f"{int(c.get('versions_published', 0))} versions published, {int(c.get('train_steps', 0))} steps, "
            f"buffer {int(s.get('buffer_groups', 0))} groups",
        )
    rejected = s.get("labelled", {}).get("rejected", {})
    if rejected:
        t.add_row("rejected", _pairs(rejected))
    if s.get("scores"):
        t.add_row("scores", _pairs(s["scores"]))
    series = reward_series([s])
    if series:
        v, mean, n = series[-1]
        t.add_row("reward", f"{mean:.3f} at version {v} ({n} rollouts; {len(series)} versions recorded)")
    for blob, p in s.get("transfers", {}).items():
        total = max(1, int(p.get("total", 1)))
        t.add_row(
            "transfer", f"{blob[:12]} {min(1.0, int(p.get('done', 0)) / total):.0%} of {fmt_bytes(total)}"
        )
    return t
