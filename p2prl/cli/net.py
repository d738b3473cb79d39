"""``p2prl peers`` and ``p2prl blob get``: operate and debug the network layer.

libp2p, trio and boto3 are imported inside the commands so ``p2prl --help`` stays fast.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

blob_app = typer.Typer(help="Fetch and verify content-addressed blobs.", no_args_is_help=True)


def _identity(key: Path | None) -> Any:
    from p2prl.crypto import Identity, load_identity

    return load_identity(key) if key else Identity.generate()


def peers(
    connect: list[str] = typer.Option(
        [], "--connect", "-c", help="Multiaddr (…/p2p/<id>) to dial; repeatable."
    ),
    network: str = typer.Option("p2prl", "--network", help="Network id."),
    key: Path | None = typer.Option(None, "--key", help="Identity key file (default: a throwaway identity)."),
    wait: float = typer.Option(1.0, "--wait", help="Seconds to listen after dialing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Start a short-lived host, dial the given peers and list who it sees."""
    from p2prl.net import NetConfig, P2PNode
    from p2prl.store import BlobStore

    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="p2prl-peers-") as tmp:
        node = P2PNode(_identity(key), network, BlobStore(tmp), NetConfig())
        with node:
            for addr in connect:
                problem = node.dial_problem(addr)  # what is wrong, not libp2p's exception
                if problem is not None:
                    errors[addr] = problem
            time.sleep(wait)
            seen = node.peers()
    info = {
        "peer_id": node.peer_id,
        "addrs": node.addrs,
        "peers": [{"peer_id": p.peer_id, "addrs": list(p.addrs), "connected": p.connected} for p in seen],
        "errors": errors,
    }
    if as_json:
        typer.echo(json.dumps(info, indent=1))
    else:
        typer.echo(f"we are {node.peer_id}")
        for p in seen:
            typer.echo(f"{'connected' if p.connected else 'known    '}  {p.peer_id}  {' '.join(p.addrs)}")
        for addr, err in errors.items():
            typer.echo(f"failed     {addr}: {err}", err=True)
    if connect and len(errors) == len(connect):
        raise typer.Exit(1)


def _load_ref(blob_id: str, manifest: Path, network: str | None) -> Any:
    """A BlobRef from a signed envelope (verified; needs the network id) or a JSON ref/body."""
    from p2prl.crypto import MAGIC
    from p2prl.protocol import BlobRef, decode_message

    raw = manifest.read_bytes()
    if raw[:4] == MAGIC:
        if not network:
            raise ValueError("a signed manifest is verified against its network: pass --network")
        _, msg = decode_message(raw, network)
        ref = getattr(msg, "blob", None)
        if ref is None:
            raise ValueError(f"a {type(msg).__name__} names no blob")
    else:
        body = json.loads(raw)
        ref = BlobRef.from_body(body.get("blob", body) if isinstance(body, dict) else body)
    if ref.id != blob_id:
        raise ValueError(f"manifest names blob {ref.id[:16]}…, not {blob_id[:16]}…")
    return ref


@blob_app.command("get")
def blob_get(
    blob_id: str = typer.Argument(..., help="sha256 of the blob (hex)."),
    manifest: Path = typer.Option(
        ..., "--manifest", "-m", help="Signed manifest/announcement, or a JSON BlobRef."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the verified blob."),
    peer: list[str] = typer.Option(
        [], "--peer", "-p", help="Multiaddr of a peer that may hold it; repeatable."
    ),
    network: str | None = typer.Option(None, "--network", help="Network id (needed for a signed manifest)."),
    s3_endpoint: str | None = typer.Option(None, "--s3-endpoint", help="S3 endpoint URL for the fallback."),
    s3_bucket: str | None = typer.Option(None, "--s3-bucket", help="S3 bucket (enables the fallback)."),
    s3_prefix: str = typer.Option("", "--s3-prefix", help="Key prefix inside the bucket."),
    timeout: float = typer.Option(300.0, "--timeout", help="Give up after this many seconds."),
    key: Path | None = typer.Option(None, "--key", help="Identity key file (default: a throwaway identity)."),
) -> None:
    """Fetch a blob from peers (S3 as fallback), verifying every chunk, and write it to OUT."""
    from p2prl.cli.progress import transfer_progress
    from p2prl.net import NetConfig, P2PNode, S3Config
    from p2prl.store import BlobStore

    try:
        ref = _load_ref(blob_id, manifest, network)
    except Exception as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    s3 = S3Config(bucket=s3_bucket, endpoint_url=s3_endpoint, prefix=s3_prefix) if s3_bucket else None
    with tempfile.TemporaryDirectory(prefix="p2prl-blob-") as tmp:
        node = P2PNode(
            _identity(key),
            network or "p2prl",
            BlobStore(tmp, max_bytes=max(ref.size * 2, 1 << 20)),
            NetConfig(s3=s3),
        )
        with node:
            for addr in peer:
                try:
                    node.connect(addr)
                except Exception as e:
                    typer.echo(f"warning: could not dial {addr}: {e!r}", err=True)
            try:
                with transfer_progress(f"blob {blob_id[:12]}", ref.size) as on_progress:
                    path = node.fetch(ref, timeout=timeout, on_progress=on_progress)
            except Exception as e:
                typer.echo(f"error: {e}", err=True)
                raise typer.Exit(1) from e
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)
    typer.echo(f"wrote {out} ({ref.size} bytes, sha256 verified)")
