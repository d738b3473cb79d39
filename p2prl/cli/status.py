"""``p2prl status URL``: a one-shot summary of a running node, read from its status endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import typer

PORT_FILE = "status.port"  # what a node writes in its data directory (p2prl.node.runtime.http)


def status_url(target: str) -> str:
    """The status URL for ``target``: a URL, host:port, or a node's data directory (its status.port)."""
    d = Path(target)
    if "://" not in target and d.is_dir():
        try:
            port = int((d / PORT_FILE).read_text().strip())
        except (OSError, ValueError) as e:
            raise ValueError(
                f"{d} has no readable {PORT_FILE}: is a node running there with its status on?"
            ) from e
        return f"http://127.0.0.1:{port}"
    return target if "://" in target else "http://" + target


def status(
    url: str = typer.Argument(
        ..., help="The node's status endpoint (e.g. http://127.0.0.1:8080) or its data directory."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the node."),
) -> None:
    """Show one node's role, version against the trainer's, sync state, peers, traffic and reward."""
    from rich.console import Console

    from p2prl.dashboard import fetch_status, status_summary

    try:
        url = status_url(url)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    try:
        s = fetch_status(url, timeout=timeout)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {url} did not answer: {e}", err=True)
        raise typer.Exit(1) from e
    if as_json:
        typer.echo(json.dumps(s, indent=1))
    else:
        Console().print(status_summary(url, s))
