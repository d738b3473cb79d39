"""Proof benchmark (placeholder until the proof layer lands)."""

import typer


def bench_proof() -> None:
    """Acceptance rates of honest and dishonest miners."""
    raise typer.Exit(2)
