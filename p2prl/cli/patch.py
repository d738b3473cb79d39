"""``p2prl patch diff|apply|inspect`` and ``p2prl bench patch``.

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
    from p2prl.patch.errors import PatchError
    from p2prl.patch.files import diff_files

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
    from p2prl.patch.errors import PatchError
    from p2prl.patch.files import apply_files

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
    from p2prl.patch.errors import PatchError
    from p2prl.patch.inspect import inspect_patch

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


def bench_patch(
    scale: float = typer.Option(
        1.0, "--scale", help="Shrink layers and vocab (1.0 = Qwen2.5-0.5B shapes, 494M)."
    ),
    lr: float = typer.Option(1e-6, "--lr", help="AdamW learning rate of the step that makes the patch."),
    warmup: int = typer.Option(10, "--warmup", help="AdamW steps before the published step."),
    zstd_level: int = typer.Option(1, "--zstd-level"),
    repeat: int = typer.Option(3, "--repeat", help="Timed repetitions (median reported)."),
    seed: int = typer.Option(0, "--seed"),
    cache: Path | None = typer.Option(None, "--cache", help="Keep the generated weights here for reruns."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Benchmark the patch codec against the PULSE reference codec on AdamW-updated bf16 weights."""
    from p2prl.patch.bench import run

    r = run(scale=scale, lr=lr, zstd_level=zstd_level, repeat=repeat, seed=seed, warmup=warmup, cache=cache)
    if as_json:
        typer.echo(json.dumps(r, indent=1))
        return
    o, p, q = r["p2prl"], r["pulse_ref"], r["ratios"]
    m = r["model"]
    lines = [
        f"model {m['params'] / 1e6:.1f}M params ({m['bytes'] / 2**20:.0f} MiB bf16), lr {m['lr']:g}, "
        f"changed {100 * r['changed_fraction']:.2f}%",
        f"p2prl      {o['bytes'] / 1e6:8.2f} MB  {o['bits_per_changed']:6.2f} bits/changed  "
        f"encode {o['encode_s']:.3f}s (+result hash {o['encode_with_result_hash_s']:.3f}s)  "
        f"decode+apply+verify {o['decode_apply_verify_s']:.3f}s",
        f"PULSE ref  {p['bytes'] / 1e6:8.2f} MB  {p['bits_per_changed']:6.2f} bits/changed  "
        f"encode {p['encode_s']:.3f}s  decode+apply {p['decode_apply_s']:.3f}s",
        f"read weights once {r['read_weights_s']:.3f}s; weights hash {r['weights_hash_s']:.3f}s",
        f"size vs PULSE {q['size_vs_pulse']:.3f}x, encode vs PULSE {q['encode_vs_pulse']:.2f}x "
        f"({q['encode_with_result_hash_vs_pulse']:.2f}x with result hash), "
        f"apply+verify vs read {q['apply_verify_vs_read']:.2f}x",
    ]
    for k in ("leb128", "u16esc"):
        ix = r["index_coding"][k]
        lines.append(
            f"indices {k:6s}: {ix['bits_per_index']:.2f} bits/index after zstd, "
            f"encode {ix['encode_mvals_s']:.0f} M/s, decode {ix['decode_mvals_s']:.0f} M/s"
        )
    typer.echo("\n".join(lines))


def bench_patch_cli(
    scale: float = typer.Option(
        0.24, "--scale", help="Model size as for `bench patch` (0.24: ≈118M parameters)."
    ),
    repeat: int = typer.Option(3, "--repeat", help="Timed runs of each process (median reported)."),
    cache: Path | None = typer.Option(None, "--cache", help="Keep the generated weights here for reruns."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Race `p2prl patch diff` against PULSE's numpy codec, each as a whole process, on the same files."""
    from p2prl.patch.bench import cli_race

    r = cli_race(scale=scale, repeat=repeat, cache=cache)
    if as_json:
        typer.echo(json.dumps(r, indent=1))
        return
    typer.echo(
        f"{r['params'] / 1e6:.0f}M parameters: p2prl patch diff {r['p2prl_patch_diff_s']:.2f} s, "
        f"PULSE reference {r['pulse_ref_s']:.2f} s, ratio {r['ratio']:.2f} "
        f"(patches {r['p2prl_bytes']} vs {r['pulse_bytes']} bytes)"
    )
