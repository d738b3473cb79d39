"""``p2prl bench patch|fanout|proof``: the benchmarks whose figures are quoted in docs/BENCHMARKS.md."""

import typer

from p2prl.cli.net import bench_fanout
from p2prl.cli.patch import bench_patch
from p2prl.cli.proof import bench_honest, bench_proof

app = typer.Typer(help="Benchmarks that print the figures quoted in the docs.", no_args_is_help=True)
app.command("patch")(bench_patch)
app.command("fanout")(bench_fanout)
app.command("proof")(bench_proof)
app.command("honest")(bench_honest)
