"""``p2prl status URL``: a one-shot summary of a running node, read from its status endpoint."""

from __future__ import annotations

import json

import typer


def status(
    url: str = typer.Argument(..., help="The node's status endpoint, e.g. http://127.0.0.1:8080."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the node."),
) -> None:
    """Show one node's role, version against the trainer's, sync state, peers, traffic and reward."""
    from rich.console import Console

    from p2prl.dashboard import fetch_status, status_summary

    if "://" not in url:
        url = "http://" + url
    try:
        s = fetch_status(url, timeout=timeout)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {url} did not answer: {e}", err=True)
        raise typer.Exit(1) from e
    if as_json:
        typer.echo(json.dumps(s, indent=1))
    else:
        Console().print(status_summary(url, s))
