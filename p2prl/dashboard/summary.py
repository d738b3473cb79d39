"""Summaries, pure so they are testable: one node's status (``p2prl status``), and a finished run's
per-version rows (CSV), checks and one-line verdict (``p2prl demo --duration``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from p2prl.dashboard.view import fmt_bytes, reward_series, sparkline


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


# -- a finished run (``p2prl demo --duration``): per-version rows, the checks and the verdict line -----

CSV_COLUMNS = ("version", "reward_mean", "rollouts_trained", "rollouts_produced", "rollouts_accepted", "acceptance")


def per_version(
    trainer: dict[str, Any] | None, validator: dict[str, Any] | None, miners: list[dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """One row per version from the final statuses: the mean reward of the rollouts the trainer took
    in (by the version that made them), how many it took, how many the miners made and the validator
    accepted, and the accepted share (None where nothing was made)."""

    def counts(s: dict[str, Any] | None) -> dict[int, tuple[float, int]]:
        by = (s or {}).get("reward_by_version", {})
        return {int(v): (float(r["mean"]), int(r["count"])) for v, r in by.items()}

    trained, accepted = counts(trainer), counts(validator)
    produced: dict[int, int] = {}
    for m in miners:
        for v, (_, n) in counts(m).items():
            produced[v] = produced.get(v, 0) + n
    rows = []
    for v in sorted(set(trained) | set(accepted) | set(produced)):
        made, ok = produced.get(v, 0), accepted.get(v, (0.0, 0))[1]
        rows.append(
            {
                "version": v,
                "reward_mean": round(trained[v][0], 4) if v in trained else None,
                "rollouts_trained": trained.get(v, (0.0, 0))[1],
                "rollouts_produced": made,
                "rollouts_accepted": ok,
                "acceptance": round(min(1.0, ok / made), 4) if made else None,
            }
        )
    return rows


def write_csv(rows: list[dict[str, Any]], path: Any) -> None:
    """The per-version rows as CSV (empty cells for unknown values), for a spreadsheet or a plot."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in CSV_COLUMNS})


def _check_versions(s: dict[str, Any]) -> tuple[str, bool, str]:
    tv = int(s.get("trainer_version", 0))
    return "trained", tv >= 1, f"{int(s.get('versions_published', 0))} versions published (trainer at v{tv})"


def _check_in_sync(s: dict[str, Any]) -> tuple[str, bool, str]:
    """Every miner on the trainer's version with its weights. A summary read while the trainer was
    still publishing (``while_publishing``: a run stopped by Ctrl-C, not quiesced) counts a miner one
    version behind as in sync: that is the normal state while a new patch spreads."""
    tv, miners = int(s.get("trainer_version", 0)), s.get("miners", [])
    lag = 1 if s.get("while_publishing") else 0
    behind = [f"{m['name']} v{m['version']}" for m in miners if not 0 <= tv - int(m.get("version", -1)) <= lag]
    n = len(miners)
    if behind:
        return "in_sync", False, f"{n - len(behind)}/{n} miners on v{tv} (behind: {', '.join(behind)})"
    spreading = [f"{m['name']} v{m['version']}" for m in miners if int(m.get("version", -1)) != tv]
    if spreading:
        return "in_sync", True, f"{n}/{n} miners on v{tv} or one behind while it spreads ({', '.join(spreading)})"
    want = s.get("trainer_weights_hash", "")
    if not want:
        return "in_sync", n > 0, f"{n}/{n} miners on v{tv}"
    other = [m["name"] for m in miners if m.get("weights_hash") != want]
    if other:
        return "in_sync", False, f"{n}/{n} miners on v{tv}, other weights: {', '.join(other)}"
    return "in_sync", n > 0, f"{n}/{n} miners on v{tv} with the trainer's weights hash"


def _check_accepted(s: dict[str, Any]) -> tuple[str, bool, str]:
    acc, rej = int(s.get("groups_accepted", 0)), int(s.get("groups_rejected", 0))
    reasons = s.get("rejections", {})
    why = ", ".join(f"{k} {int(v)}" for k, v in sorted(reasons.items(), key=lambda kv: -int(kv[1])))
    return "accepted", acc > 0, f"groups {acc} accepted, {rej} rejected" + (f" ({why})" if why else "")


# each takes the summary and gives (name, ok, detail); a summary's own ``checks`` ({name: bool, or
# {"ok": bool, "detail": str}}) are added after these, so a new check is one entry in either place
SUMMARY_CHECKS: list[Any] = [_check_versions, _check_in_sync, _check_accepted]


def run_checks(s: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """The checks of a run summary, in order: the built-in ones, then the summary's ``checks``."""
    out = [check(s) for check in SUMMARY_CHECKS]
    for name, c in (s.get("checks") or {}).items():
        ok, detail = (bool(c.get("ok")), str(c.get("detail", ""))) if isinstance(c, dict) else (bool(c), "")
        out.append((str(name), ok, detail))
    return out


def _reward_text(s: dict[str, Any]) -> str:
    first, last = s.get("reward_first"), s.get("reward_last")
    if first is None or last is None:
        return "reward: none recorded"
    return f"reward {first:.3f} → {last:.3f} (first → last versions)"


def miner_lines(s: dict[str, Any]) -> list[str]:
    """Per miner: version, the validator's score and its groups accepted/rejected."""
    return [
        f"{m['name']}: v{m['version']}, score {int(m.get('score', 0))}, "
        f"groups {int(m.get('groups_accepted', 0))} accepted / {int(m.get('groups_rejected', 0))} rejected"
        for m in s.get("miners", [])
    ]


def verdict_line(s: dict[str, Any]) -> str:
    """One line: OK or what failed, then versions, sync, verdicts, each miner's score and the reward."""
    if s.get("error"):
        return f"verdict: FAILED: {str(s['error']).splitlines()[0]}"
    checks = run_checks(s)
    failed = [name for name, ok, _ in checks if not ok]
    scores = ", ".join(f"{m['name']} {int(m.get('score', 0))}" for m in s.get("miners", []))
    parts = [detail for _, _, detail in checks if detail]
    parts += [f"scores {scores}" if scores else "no miners", _reward_text(s)]
    head = "verdict: OK" if not failed else f"verdict: PROBLEM ({', '.join(failed)})"
    return f"{head}: " + "; ".join(parts)


def run_report(s: dict[str, Any]) -> list[str]:
    """What a finished run prints: the reward per version as a sparkline, each miner, the verdict."""
    lines = []
    rewards = [r["reward_mean"] for r in s.get("by_version", []) if r.get("reward_mean") is not None]
    if rewards:
        lines.append(f"reward by version (v{s['by_version'][0]['version']}…): {sparkline(rewards, 64)}")
    lines += miner_lines(s)
    lines += learning_lines(s)
    lines.append(verdict_line(s))
    return lines


def learning_lines(s: dict[str, Any]) -> list[str]:
    """The held-out accuracy, base model → last version, and why nothing trained when nothing did."""
    out = []
    h = s.get("held_out") or {}
    if h.get("error"):
        out.append(f"held-out accuracy: not measured ({h['error']})")
    elif h.get("problems"):
        head = f"held-out accuracy ({h['problems']} problems, greedy): {h['first']:.3f}"
        if h.get("last") is None:
            out.append(f"{head}, no trained version saved; mean reward {h.get('reward_first', 0.0):.3f}")
        else:
            out.append(
                f"{head} → {h['last']:.3f} (v{h.get('version')}); "
                f"mean reward {h.get('reward_first', 0.0):.3f} → {h.get('reward_last', 0.0):.3f}"
            )
    if s.get("notice"):
        out.append(f"notice: {s['notice']}")
    return out
