"""``p2prl patch diff|apply|inspect`` (placeholder until the patch codec lands)."""

import typer

app = typer.Typer(help="Create, apply and inspect sparse weight patches.", no_args_is_help=True)


def bench_patch() -> None:
    """Benchmark the patch codec against the PULSE reference codec."""
    raise typer.Exit(2)
