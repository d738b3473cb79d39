"""``p2prl peers`` and ``p2prl blob get`` (placeholder until the network layer lands)."""

import typer

blob_app = typer.Typer(help="Fetch and verify content-addressed blobs.", no_args_is_help=True)


def peers() -> None:
    """List the peers this node sees."""
    raise typer.Exit(2)


def bench_fanout() -> None:
    """Benchmark swarm fan-out of one blob to N peers."""
    raise typer.Exit(2)
