"""``p2prl bench proof``: acceptance rates of honest and dishonest miners, and the proof's costs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def bench_proof(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    rollouts: int = typer.Option(200, "--rollouts", min=8, help="Rollouts per case and model."),
    models: str = typer.Option(
        "tiny,big", "--models", help="Comma list of: tiny (default model), big (~24M)."
    ),
    checked_per_group: int = typer.Option(
        2, "--checked-per-group", min=0, help="Rollouts per group the validator recomputes (0: all)."
    ),
    lr: float = typer.Option(3e-6, "--lr", help="AdamW learning rate of the versions behind stale_k*."),
    cache_dir: Path = typer.Option(
        Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl")),
        "--cache-dir",
        help="Where the default model is built (env P2PRL_CACHE).",
    ),
) -> None:
    """Acceptance of honest and dishonest miners on two model configurations."""
    from p2prl.bench.proof import run

    which = tuple(m.strip() for m in models.split(",") if m.strip())
    if not which or set(which) - {"tiny", "big"}:
        raise typer.BadParameter("models must be a comma list of tiny, big")

    def log(msg: str) -> None:
        if not as_json:
            typer.echo(msg)

    result = run(cache_dir, rollouts, which, lr, log=log, checked_per_group=checked_per_group)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True, default=float))
        return
    typer.echo(f"\n{'case':22s} {'n':>6s} {'accepted':>9s} {'rate':>7s}")
    for c in result["cases"]:
        rate = c["accepted"] / c["n"] if c["n"] else 0.0
        typer.echo(f"{c['case']:22s} {c['n']:6d} {c['accepted']:9d} {rate:7.1%}")
    for name, m in result["models"].items():
        gen = m["generate_seconds_per_rollout"]
        ver, full = m["verify_seconds_per_rollout"], m["verify_full_seconds_per_rollout"]
        typer.echo(
            f"{name}: generate {gen * 1e3:.2f} ms/rollout; verify {ver * 1e3:.2f} ms/rollout "
            f"({ver / gen:.0%}), every rollout recomputed {full * 1e3:.2f} ({full / gen:.0%}); "
            f"blob {m['blob_bytes_per_token']:.1f} B/token"
        )
    typer.echo(f"commitment: {result['commitment_bytes_per_token']} bytes per token")
    g = result["grail_reference"]
    typer.echo(
        "grail's sketch on the same states, accepted: "
        + ", ".join(f"{c} {v['accepted']}/{v['n']}" for c, v in g.items())
    )


def bench_honest(
    rollouts: int = typer.Option(1700, "--rollouts", min=8, help="Honest rollouts per setting and model."),
    models: str = typer.Option("tiny", "--models", help="Comma list of: tiny (default model), big (~24M)."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Engine batch sizes."),
    threads: str = typer.Option("1,2", "--threads", help="Miner thread counts."),
    miner_device: str = typer.Option("cpu", "--miner-device", help="Torch device of the miner's engine."),
    validator_device: str = typer.Option(
        "cpu", "--validator-device", help="Torch device of the validator (it calibrates there)."
    ),
    train_steps: int = typer.Option(0, "--train-steps", min=0, help="Train the model this many steps first."),
    lr: float = typer.Option(3e-3, "--lr", help="Learning rate of those steps."),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", min=0, help="Completion length (0: default)."),
    cache_dir: Path = typer.Option(
        Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl")), "--cache-dir"
    ),
) -> None:
    """Honest acceptance (the false-reject rate) across engine batch sizes, thread counts and devices."""
    from p2prl.bench.proof import honest_acceptance

    result = honest_acceptance(
        cache_dir,
        rollouts,
        tuple(m.strip() for m in models.split(",") if m.strip()),
        tuple(int(b) for b in batch_sizes.split(",")),
        tuple(int(t) for t in threads.split(",")),
        log=typer.echo,
        miner_device=miner_device,
        validator_device=validator_device,
        train_steps=train_steps,
        lr=lr,
        max_new_tokens=max_new_tokens,
    )
    typer.echo(json.dumps(result, sort_keys=True, default=float))
