"""Rendering of node statuses (the JSON of ``/status``) into rich tables; pure, so it is testable."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
Status = dict[str, Any]
WIDE = 120  # narrower terminals (80x24 included) get the compact layout


def sparkline(
    values: list[float], width: int = 48, lo: float | None = None, hi: float | None = None
) -> str:
    """A one-line chart of ``values`` (the newest ``width`` of them), scaled to [``lo``, ``hi``]
    (default: their own range; a value outside a given range is drawn at its edge)."""
    vals = values[-width:]
    if not vals:
        return ""
    lo = min(vals) if lo is None else lo
    hi = max(vals) if hi is None else hi
    span = hi - lo or 1.0
    top = len(SPARK) - 1
    return "".join(SPARK[max(0, min(top, int((v - lo) / span * top + 0.5)))] for v in vals)


def reward_series(statuses: list[Status]) -> list[tuple[int, float, int]]:
    """(version, mean reward, count) from the trainer's status, else merged from all nodes."""
    src = [s for s in statuses if s.get("role") == "trainer" and s.get("reward_by_version")]
    if not src:
        src = [s for s in statuses if s.get("reward_by_version")]
    merged: dict[int, list[float]] = {}
    for s in src:
        for v, r in s.get("reward_by_version", {}).items():
            m = merged.setdefault(int(v), [0.0, 0])
            m[0] += float(r["mean"]) * int(r["count"])
            m[1] += int(r["count"])
    return [(v, m[0] / m[1], int(m[1])) for v, m in sorted(merged.items()) if m[1]]


def _scaled(n: float) -> tuple[float, int]:
    """``n`` in its binary unit: (value, 0 for bytes … 3 for GiB)."""
    i = 0
    while abs(n) >= 1024 and i < 3:
        n /= 1024
        i += 1
    return n, i


def fmt_bytes(n: float) -> str:
    v, i = _scaled(n)
    return f"{v:.0f} B" if i == 0 else f"{v:.1f} {('B', 'KiB', 'MiB', 'GiB')[i]}"


def _short_bytes(n: float) -> str:
    """Compact size for narrow columns: 0B, 512B, 88K, 1.7M, 12M, 3.2G."""
    v, i = _scaled(n)
    return f"{v:.0f}{'BKMG'[i]}" if i == 0 or abs(v) >= 10 else f"{v:.1f}{'BKMG'[i]}"


def _trainer_version(statuses: list[Status]) -> int:
    tv = [int(s.get("version", 0)) for s in statuses if s.get("role") == "trainer"]
    if tv:
        return max(tv)
    return max((int(s.get("trainer_version", 0)) for s in statuses), default=0)


def _role(s: Status) -> str:
    """The role, and for a miner its rollout engine (hf or vllm)."""
    role = str(s.get("role", "?"))
    return f"{role} {s['engine']}" if role == "miner" and s.get("engine") else role


def nodes_table(nodes: list[tuple[str, Status | None, str]]) -> Table:
    statuses = [s for _, s, _ in nodes if s]
    tv = _trainer_version(statuses)
    t = Table(title=f"nodes (trainer at version {tv}; rollout counts are groups)", expand=True)
    cols = (
        "node",
        "role",
        "version",
        "lag",
        "sync",
        "peers",
        "patch",
        "apply",
        "up",
        "down",
        "produced",
        "accepted",
        "rejected",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("node", "role", "sync") else "right")
    for url, s, err in nodes:
        if s is None:
            t.add_row(url, "?", "-", "-", Text(f"unreachable: {err}"[:40], style="red"), *["-"] * 8)
            continue
        c, g = s.get("counters", {}), s.get("gauges", {})
        lag = max(0, tv - int(s.get("version", 0)))
        lag_style = "green" if lag == 0 else ("yellow" if lag <= 2 else "red")
        state = _state(s)
        t.add_row(
            f"{s.get('key', '')[:10]} {url.rsplit(':', 1)[-1]}",
            _role(s),
            str(s.get("version", 0)),
            Text(str(lag), style=lag_style),
            state,
            str(s.get("peers", 0)),
            _short_bytes(g.get("patch_last_bytes", 0)) if "patch_last_bytes" in g else "-",
            f"{g['patch_apply_ms']:.0f} ms" if "patch_apply_ms" in g else "-",
            _short_bytes(g.get("net_bytes_up", 0)),
            _net_down(g),
            str(c.get("groups_produced", 0)),
            str(c.get("groups_accepted", c.get("groups_consumed", 0))),
            str(c.get("groups_rejected", 0)),
        )
    return t


def _state(s: Status, width: int = 40) -> Text:
    """The sync state, or what a validator's judging is doing instead when it is not keeping up: a
    trainer waiting on it then shows why (calibrating, or behind with its oldest queued age)."""
    judging = str(s.get("judging", ""))
    if judging.startswith("behind"):
        return Text(f"judging {judging}"[:width], style="red")
    if s.get("calibrating"):
        return Text("calibrating"[:width], style="yellow")
    return Text(str(s.get("sync_state", ""))[:width])


def _node_name(url: str, s: Status | None) -> str:
    """Key prefix and status port (what tells nodes apart on one host); host:port when unreachable."""
    port = url.rsplit(":", 1)[-1]
    return f"{s.get('key', '')[:8]} {port}" if s else url.split("//", 1)[-1]


def compact_nodes_table(nodes: list[tuple[str, Status | None, str]]) -> Table:
    """The nodes table in under 80 columns, one line per node: no borders, the essential columns."""
    statuses = [s for _, s, _ in nodes if s]
    tv = _trainer_version(statuses)
    t = Table(
        title=f"nodes (trainer v{tv}; counts are groups)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        collapse_padding=True,
        show_edge=False,
    )
    for col in ("node", "role", "ver", "lag", "sync", "peers", "down", "acc", "rej"):
        left = col in ("node", "role", "sync")
        t.add_column(col, justify="left" if left else "right", no_wrap=True, overflow="ellipsis")
    for url, s, _err in nodes:
        if s is None:
            t.add_row(_node_name(url, s), "?", "-", "-", Text("unreachable", style="red"), *["-"] * 4)
            continue
        c, g = s.get("counters", {}), s.get("gauges", {})
        lag = max(0, tv - int(s.get("version", 0)))
        t.add_row(
            _node_name(url, s),
            _role(s),
            str(s.get("version", 0)),
            Text(str(lag), style="green" if lag == 0 else ("yellow" if lag <= 2 else "red")),
            _state(s, 11),
            str(s.get("peers", 0)),
            _net_down(g),
            str(c.get("groups_accepted", c.get("groups_consumed", 0))),
            str(c.get("groups_rejected", 0)),
        )
    return t


class NodesView:
    """The full nodes table on a wide terminal, the compact one below ``WIDE`` columns."""

    def __init__(self, nodes: list[tuple[str, Status | None, str]]) -> None:
        self.nodes = nodes

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= WIDE
        yield nodes_table(self.nodes) if wide else compact_nodes_table(self.nodes)


def _net_down(g: dict[str, float]) -> Text:
    """Bytes fetched from peers, plus those from S3 (in yellow: peers could not deliver them)."""
    peers, s3 = g.get("net_bytes_down", 0), g.get("net_bytes_s3", 0)
    if not s3:
        return Text(_short_bytes(peers))
    return Text(f"{_short_bytes(peers)}+{_short_bytes(s3)}S3", style="yellow")


def transfers_table(statuses: list[Status]) -> Table | None:
    rows = []
    for s in statuses:
        for blob, p in s.get("transfers", {}).items():
            total = max(1, int(p.get("total", 1)))
            frac = min(1.0, int(p.get("done", 0)) / total)
            bar = "█" * int(frac * 20) + "░" * (20 - int(frac * 20))
            rows.append(
                (
                    f"{s.get('role', '?')} {s.get('key', '')[:8]}",
                    blob[:12],
                    bar,
                    f"{frac:.0%} of {fmt_bytes(total)}",
                )
            )
    if not rows:
        return None
    t = Table(title="transfers", expand=True)
    for col in ("node", "blob", "progress", ""):
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    return t


def rejections_table(statuses: list[Status]) -> Table | None:
    reasons: dict[str, int] = {}
    for s in statuses:
        if s.get("role") != "validator":
            continue
        for reason, n in s.get("labelled", {}).get("rejected", {}).items():
            reasons[reason] = reasons.get(reason, 0) + int(n)
    if not reasons:
        return None
    t = Table(title="rejected rollout groups by reason (validators)")
    t.add_column("reason")
    t.add_column("groups", justify="right")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        t.add_row(reason, str(n))
    return t


def scores_table(statuses: list[Status]) -> Table | None:
    rows = []
    for s in statuses:
        if s.get("role") == "validator":
            for miner, score in s.get("scores", {}).items():
                rows.append((s.get("key", "")[:10], miner[:16], int(score)))
    if not rows:
        return None
    t = Table(title="per-miner scores (validator window)")
    for col in ("validator", "miner", "score"):
        t.add_column(col, justify="right" if col == "score" else "left")
    for v, m, sc in sorted(rows, key=lambda r: (r[0], -r[2])):
        t.add_row(v, m, Text(str(sc), style="green" if sc > 0 else "red"))
    return t


REWARD_FRACTION = 0.1  # reward_first / reward_last: mean over the first / last 10 % of versions…
REWARD_MIN_VERSIONS = 3  # …but over at least this many (one version's mean is a noisy sample)
SPARK_WIDTH = 48


def mean_reward(series: list[tuple[int, float, int]]) -> float | None:
    """Mean over all rollouts of the given (version, mean, count) entries."""
    n = sum(c for _, _, c in series)
    return sum(m * c for _, m, c in series) / n if n else None


def reward_ends(series: list[tuple[int, float, int]]) -> tuple[float | None, float | None]:
    """(reward_first, reward_last): the mean reward of all rollouts in the first / last 10 % of the
    versions that have any (at least 3 versions each), so one noisy version does not decide them."""
    k = max(REWARD_MIN_VERSIONS, round(REWARD_FRACTION * len(series)))
    return mean_reward(series[:k]), mean_reward(series[-k:])


def smoothed(series: list[tuple[int, float, int]], width: int = SPARK_WIDTH) -> list[float]:
    """The whole history in at most ``width`` contiguous buckets, each its rollout-weighted mean."""
    n = len(series)
    buckets = min(width, n)
    out = []
    for b in range(buckets):
        m = mean_reward(series[b * n // buckets : (b + 1) * n // buckets])
        if m is not None:
            out.append(m)
    return out


def skipped_notice(statuses: list[Status]) -> str:
    """Why the trainer learns nothing, when its recent steps were all skipped (every group's rewards
    equal, so GRPO's advantages are all zero): "" otherwise."""
    for s in statuses:
        c = s.get("counters", {})
        steps, skipped = int(c.get("train_steps", 0)), int(c.get("train_steps_skipped", 0))
        if skipped and skipped == steps:
            return (
                f"notice: the trainer skipped all {steps} steps so far: every group's rewards were equal "
                "(no GRPO signal)"
            )
    return ""


def reward_panel(statuses: list[Status]) -> Panel:
    series = reward_series(statuses)
    notice = skipped_notice(statuses)
    if not series:
        return Panel(notice or "no rewards recorded yet", title="mean task reward over versions")
    # the summary's ends, but never overlapping on a short history
    k = max(1, min(max(REWARD_MIN_VERSIONS, round(REWARD_FRACTION * len(series))), len(series) // 2))
    first, last = mean_reward(series[:k]), mean_reward(series[-k:])
    body = Text()
    body.append(sparkline(smoothed(series)) + "\n", style="cyan")
    body.append(
        f"first {k} versions: {first or 0.0:.3f}  →  last {k}: {last or 0.0:.3f}   "
        f"(v{series[0][0]}–v{series[-1][0]}, {len(series)} versions)"
    )
    if notice:
        body.append("\n" + notice, style="yellow")
    return Panel(body, title="mean task reward over versions")


class ExtrasView:
    """Scores, rejections and transfers: stacked when wide; borderless, and scores beside
    rejections, when narrow, so a 4-node network fits 80x24."""

    def __init__(self, statuses: list[Status]) -> None:
        self.statuses = statuses

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        tables = [scores_table(self.statuses), rejections_table(self.statuses), transfers_table(self.statuses)]
        if options.max_width >= WIDE:
            yield from (t for t in tables if t is not None)
            return
        for t, title in zip(tables, ("miner scores", "rejected groups", "transfers"), strict=True):
            if t is not None:
                t.box, t.show_edge, t.expand, t.title = box.SIMPLE_HEAD, False, False, title
        scores, rejections, transfers = tables
        pair = [t for t in (scores, rejections) if t is not None]
        if len(pair) == 2:
            grid = Table.grid(padding=(0, 2))
            grid.add_row(*pair)
            yield grid
        else:
            yield from pair
        if transfers is not None:
            yield transfers


def render(nodes: list[tuple[str, Status | None, str]]) -> Group:
    """The whole view for ``nodes`` = [(url, status or None, error text)]; it fits the console's width."""
    statuses = [s for _, s, _ in nodes if s]
    return Group(NodesView(nodes), reward_panel(statuses), ExtrasView(statuses))
