"""``p2prl bench flood``: honest throughput and latency of a validator and trainer under a flood."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def bench_flood(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a summary."),
    seconds: float = typer.Option(30.0, "--seconds", min=5.0, help="Length of each phase."),
    every: float = typer.Option(1.5, "--every", min=0.2, help="Seconds between honest announcements."),
    miners: int = typer.Option(4, "--miners", min=1, help="Honest miners (keys)."),
    attackers: int = typer.Option(
        2, "--attackers", min=1, help="Attacker hosts, each at the per-peer limit."
    ),
    keys: int = typer.Option(500, "--keys", min=1, help="Signing keys per attacker host."),
    inject: bool = typer.Option(
        False,
        "--inject",
        help="Deliver the flood straight to the roles' handlers (full rate) instead of by gossip.",
    ),
    cache_dir: Path = typer.Option(
        Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl")),
        "--cache-dir",
        help="Where the default model is built (env P2PRL_CACHE).",
    ),
) -> None:
    """Honest batches judged per minute and their latency, without and with an announcement flood."""
    from p2prl.bench.flood import FloodSpec, run

    def log(msg: str) -> None:
        if not as_json:
            typer.echo(msg)

    r = run(cache_dir, FloodSpec(seconds, every, miners, attackers, keys, inject), log=log)
    if as_json:
        typer.echo(json.dumps(r, sort_keys=True))
        return
    for name in ("no_flood", "flood"):
        p = r[name]
        p50, p95 = p["latency_p50_s"], p["latency_p95_s"]
        typer.echo(
            f"{name:9s} judged {p['judged']}/{p['announced']}  {p['per_minute']:.1f}/min  "
            f"latency p50 {p50 if p50 is None else round(p50, 2)} s  p95 {p95 if p95 is None else round(p95, 2)} s"
        )
    got = ", ".join(f"{k} {v:.0f}/s" for k, v in r["gossip_in_per_s_under_flood"].items())
    typer.echo(f"flood: {r['flood_msgs_per_s']:.0f} announcements/s offered; gossip arriving: {got}")
    if r["inject"]:
        typer.echo(f"injected into the handlers: {r['injected']} announcements")
    typer.echo(f"honest rate under flood: {r['ratio']:.0%} of unflooded")
    typer.echo(
        f"validator: {r['validator_batches_checked']} batches judged, dropped {r['validator_dropped']}"
    )
    typer.echo(f"trainer dropped: {r['trainer_dropped']}")
