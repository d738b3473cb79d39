"""``p2prl bench swarm-sim``: patch fan-out to many peers, simulated (swarm vs star vs relay tree)."""

from __future__ import annotations

import json

import typer


def bench_swarm_sim(
    peers: int = typer.Option(
        100, "--peers", min=1, help="Peers that fetch the patch (the trainer not counted)."
    ),
    patch_mib: float = typer.Option(16.0, "--patch-mib", min=0.01, help="Patch size in MiB."),
    chunk_kib: int = typer.Option(
        1024, "--chunk-kib", min=16, help="Chunk size in KiB (genesis default 1 MiB)."
    ),
    up_min: float = typer.Option(
        10.0, "--up-min-mbit", help="Slowest peer uplink (Mbit/s), log-uniform draw."
    ),
    up_max: float = typer.Option(1000.0, "--up-max-mbit", help="Fastest peer uplink (Mbit/s)."),
    link_mbit: float = typer.Option(0.0, "--link-mbit", help="> 0: every link this rate both ways, no NAT."),
    up_mbit: float = typer.Option(0.0, "--up-mbit", help="> 0: every peer's uplink this rate (asymmetric)."),
    trainer_mbit: float = typer.Option(
        1000.0, "--trainer-mbit", help="Trainer uplink and downlink (Mbit/s)."
    ),
    nat_share: float = typer.Option(0.5, "--nat-share", min=0.0, max=1.0, help="Share of peers behind NAT."),
    latency_ms: float = typer.Option(25.0, "--latency-ms", help="One-way latency of every message."),
    join_spread_s: float = typer.Option(0.0, "--join-spread-s", help="Peers join over this long."),
    cooldown_s: float = typer.Option(1.0, "--cooldown-s", help="Trainer superseed cooldown (0: off)."),
    cap_mb_s: float = typer.Option(0.0, "--cap-mb-s", help="Peers' upload cap, MB/s (0: none)."),
    fanout: int = typer.Option(4, "--tree-fanout", min=1, help="Children per relay-tree node."),
    provider_order: str = typer.Option(
        "id", "--provider-order", help="Providers after the trainer: 'id' (the node's order) or 'random'."
    ),
    seed: int = typer.Option(1, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Simulate one patch's fan-out with the swarm's own chunk logic, against a star and a relay tree."""
    from p2prl.netsim.population import Spec
    from p2prl.netsim.report import run_all

    if provider_order not in ("id", "random"):
        raise typer.BadParameter("'id' or 'random'", param_hint="--provider-order")

    spec = Spec(
        peers=peers,
        patch_mib=patch_mib,
        chunk_kib=chunk_kib,
        up_mbit=(up_min, up_max),
        link_mbit=link_mbit,
        up_override_mbit=up_mbit,
        trainer_mbit=trainer_mbit,
        nat_share=nat_share,
        latency_s=latency_ms / 1000,
        join_spread_s=join_spread_s,
        seed=seed,
    )
    res = run_all(
        spec, fanout=fanout, cooldown_s=cooldown_s, cap_mb_s=cap_mb_s, provider_order=provider_order
    )
    if as_json:
        typer.echo(json.dumps(res, indent=1))
        return
    typer.echo(f"{peers} peers, {patch_mib} MiB patch, {res['nat_peers']} behind NAT")
    for name in ("swarm", "star", "tree"):
        r = res[name]
        typer.echo(
            f"{name:6} trainer upload {r['trainer_upload_x']:>8}x  t50 {r['t50_s']} s  t90 {r['t90_s']} s  "
            f"t100 {r['t100_s']} s  complete {r['complete']}/{peers}"
        )
