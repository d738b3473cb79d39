"""``p2prl patch diff|apply|inspect``.

Heavy imports (torch, safetensors, the codec) happen inside the commands so ``p2prl --help``
stays fast. Every failure prints one ``error: <reason>`` line, exits 1, and writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="Create, apply and inspect sparse weight patches.", no_args_is_help=True)


def _fail(reason: object) -> typer.Exit:
    typer.echo(f"error: {reason}", err=True)
    return typer.Exit(1)


@app.command()
def diff(
    base: Path = typer.Argument(..., help="Base weights (.safetensors)."),
    new: Path = typer.Argument(..., help="New weights (.safetensors)."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the patch."),
    zstd_level: int = typer.Option(1, "--zstd-level", help="zstd level (1 is the default codec)."),
) -> None:
    """Write the patch that takes BASE to NEW; prints size, changed fraction, bits per change."""
    from p2prl.patch import PatchError, diff_files

    try:
        stats = diff_files(base, new, out, zstd_level=zstd_level)
    except (PatchError, OSError) as e:
        raise _fail(e) from None
    typer.echo(
        f"wrote {out}: {stats.total_bytes} bytes, changed {stats.changed}/{stats.numel} "
        f"({100 * stats.changed / max(1, stats.numel):.3f}%), {stats.bits_per_changed:.2f} bits per changed element"
    )


@app.command()
def apply(
    base: Path = typer.Argument(..., help="Base weights (.safetensors)."),
    patch: Path = typer.Argument(..., help="Patch file."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the patched weights (.safetensors)."),
) -> None:
    """Apply PATCH to BASE; writes OUT only if the result hash matches the one in the patch."""
    from p2prl.patch import PatchError, apply_files

    try:
        h = apply_files(base, patch, out)
    except (PatchError, OSError) as e:
        raise _fail(e) from None
    typer.echo(f"wrote {out}: weights hash {h}")


@app.command()
def inspect(
    patch: Path = typer.Argument(..., help="Patch file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print a patch's header and per-tensor counts and sizes."""
    from p2prl.patch import PatchError, inspect_patch

    try:
        info = inspect_patch(patch.read_bytes())
    except (PatchError, OSError) as e:
        raise _fail(e) from None
    if as_json:
        typer.echo(json.dumps(info))
        return
    typer.echo(
        f"{info['codec']} format {info['format_version']}, zstd {info['zstd_level']}, {info['bytes']} bytes\n"
        f"base   {info['base_hash']}\nresult {info['result_hash']}\n"
        f"changed {info['changed']}/{info['numel']} ({100 * info['changed_fraction']:.3f}%), "
        f"{info['bits_per_changed']:.2f} bits per changed element, {info['segments']} segments"
    )
    for t in info["tensors"]:
        if t["changed"]:
            codings = ",".join(k for k, v in t["value_codings"].items() if v)
            dense = f" dense {t['dense_segments']}" if t["dense_segments"] else ""
            typer.echo(
                f"  {t['name']} {t['dtype']}{t['shape']}: {t['changed']} changed, "
                f"index {t['index_bytes']} B, values {t['value_bytes']} B ({codings}){dense}"
            )
