"""``p2prl bench patch|patch-cli|fanout|proof|honest|flood|trainer|swarm-sim|memory``: the benchmarks whose
figures are quoted in docs/BENCHMARKS.md."""

import typer

from p2prl.cli.flood import bench_flood
from p2prl.cli.net import bench_fanout
from p2prl.cli.netsim import bench_swarm_sim
from p2prl.cli.patch import bench_patch, bench_patch_cli
from p2prl.cli.proof import bench_honest, bench_proof
from p2prl.cli.rl import bench_trainer

app = typer.Typer(help="Benchmarks that print the figures quoted in the docs.", no_args_is_help=True)
app.command("patch")(bench_patch)
app.command("patch-cli")(bench_patch_cli)
app.command("fanout")(bench_fanout)
app.command("proof")(bench_proof)
app.command("honest")(bench_honest)
app.command("flood")(bench_flood)
app.command("trainer")(bench_trainer)
app.command("swarm-sim")(bench_swarm_sim)


@app.command("memory")
def bench_memory(
    sizes: str = typer.Option(
        "s,m,l", "--sizes", help="Comma-separated sizes from p2prl.bench.memory.SHAPES."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Peak RSS of each role's model work (miner, validator, trainer) against parameter count."""
    import json

    from p2prl.bench.memory import run_memory_bench

    rows = run_memory_bench(tuple(s for s in sizes.split(",") if s))
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    typer.echo(
        f"{'size':4} {'role':9} {'params':>11} {'bf16 MiB':>9} {'base MiB':>9} {'peak MiB':>9} {'added/bf16':>10}"
    )
    for r in rows:
        added = (r["peak_mib"] - r["baseline_mib"]) / r["bf16_mib"]
        typer.echo(
            f"{r['size']:4} {r['role']:9} {r['parameters']:>11,} {r['bf16_mib']:>9.1f} {r['baseline_mib']:>9.1f} "
            f"{r['peak_mib']:>9.1f} {added:>10.2f}"
        )
