"""``p2prl node|network|demo|dashboard`` (placeholder until the node lands)."""

import typer


def register(app: typer.Typer) -> None:
    """Add the node's commands to the root app."""
