"""``p2prl keys generate|show``: the node's Ed25519 identity."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from p2prl.crypto import Identity, KeyFileError, load_identity, save_identity

app = typer.Typer(
    help="Manage the node identity (Ed25519 seed; also the libp2p peer id).", no_args_is_help=True
)

DEFAULT_KEY = Path("p2prl-data/node.key")


@app.command()
def generate(
    path: Path = typer.Option(DEFAULT_KEY, "--out", "-o", help="Where to write the key file (mode 0600)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing key file."),
) -> None:
    """Create a new identity and write its seed to a file only its owner can read."""
    identity = Identity.generate()
    try:
        save_identity(identity, path, overwrite=force)
    except KeyFileError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"wrote {path}\npublic key {identity.public_hex}")


@app.command()
def show(
    path: Path = typer.Argument(DEFAULT_KEY, help="Key file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the public key and libp2p peer id of a key file (never the seed)."""
    try:
        identity = load_identity(path)
    except KeyFileError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    from p2prl.net import peer_id_for

    info = {"public_key": identity.public_hex, "peer_id": peer_id_for(identity)}
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(f"public key {info['public_key']}\npeer id    {info['peer_id']}")
