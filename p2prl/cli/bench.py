"""``p2prl bench patch|patch-cli|fanout|proof|flood|trainer``: the benchmarks whose figures are quoted in docs/BENCHMARKS.md."""

import typer

from p2prl.cli.flood import bench_flood
from p2prl.cli.net import bench_fanout
from p2prl.cli.netsim import bench_swarm_sim
from p2prl.cli.patch import bench_patch, bench_patch_cli
from p2prl.cli.proof import bench_proof
from p2prl.cli.rl import bench_trainer

app = typer.Typer(help="Benchmarks that print the figures quoted in the docs.", no_args_is_help=True)
app.command("patch")(bench_patch)
app.command("patch-cli")(bench_patch_cli)
app.command("fanout")(bench_fanout)
app.command("proof")(bench_proof)
app.command("flood")(bench_flood)
app.command("trainer")(bench_trainer)
app.command("swarm-sim")(bench_swarm_sim)
