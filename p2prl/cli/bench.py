"""``p2prl bench patch|patch-cli|fanout|proof|cheats|honest|flood|trainer|swarm-sim|memory|scale|engine-update``: the benchmarks whose
figures are quoted in docs/BENCHMARKS.md.

Each command prints what one benchmark of :mod:`p2prl.bench` measures (``--json`` for the record);
the benchmark and everything heavy it needs are imported inside the command so ``p2prl --help``
stays fast.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import typer

from p2prl.cli.node import node_signature

app = typer.Typer(help="Benchmarks that print the figures quoted in the docs.", no_args_is_help=True)

_CACHE = Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl"))  # env P2PRL_CACHE


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
    from p2prl.bench.patch import run

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
    from p2prl.bench.patch import cli_race

    r = cli_race(scale=scale, repeat=repeat, cache=cache)
    if as_json:
        typer.echo(json.dumps(r, indent=1))
        return
    typer.echo(
        f"{r['params'] / 1e6:.0f}M parameters: p2prl patch diff {r['p2prl_patch_diff_s']:.2f} s, "
        f"PULSE reference {r['pulse_ref_s']:.2f} s, ratio {r['ratio']:.2f} "
        f"(patches {r['p2prl_bytes']} vs {r['pulse_bytes']} bytes)"
    )


def bench_fanout(
    n_peers: int = typer.Option(8, "--peers", help="Peers fetching the blob (separate processes)."),
    size_mib: int = typer.Option(64, "--size-mib", help="Blob size in MiB."),
    chunk_kib: int = typer.Option(1024, "--chunk-kib", help="Chunk size in KiB."),
    cap_mb_s: float = typer.Option(
        30.0, "--cap-mb-s", min=0.1, help="Upload cap of each provider in the capped phase (MB/s)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    testbed: bool = typer.Option(
        False, "--testbed", help="Run every node on its own rate-limited testbed host (root; p2prl testbed)."
    ),
    link_mbit: float = typer.Option(
        50.0, "--link-mbit", min=0.1, help="Testbed: each link's rate, both ways."
    ),
    up_mbit: float = typer.Option(0.0, "--up-mbit", help="Testbed: upload rate (default --link-mbit)."),
    down_mbit: float = typer.Option(0.0, "--down-mbit", help="Testbed: download rate (default --link-mbit)."),
    nat: int = typer.Option(0, "--nat", min=0, help="Testbed: how many peers sit behind NAT routers."),
) -> None:
    """Benchmark swarm fan-out of one blob from a publisher to N peers (loopback, or the testbed)."""
    from p2prl.bench.fanout import run_fanout, run_fanout_testbed

    if testbed:
        res = run_fanout_testbed(
            n_peers,
            size_mib,
            chunk_kib,
            up_mbit=up_mbit or link_mbit,
            down_mbit=down_mbit or link_mbit,
            nat=nat,
        )
    else:
        res = run_fanout(n_peers, size_mib, chunk_kib, cap_mb_s=cap_mb_s)
    if as_json:
        typer.echo(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            typer.echo(f"{k:24} {v}")
    if not res["all_verified"]:
        raise typer.Exit(1)


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
        _CACHE,
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


def bench_cheats(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    rollouts: int = typer.Option(256, "--rollouts", min=128, help="Rollouts per case (batches of 128)."),
    train_steps: int = typer.Option(8, "--train-steps", min=8, help="GRPO-shaped steps before the cases."),
    cache_dir: Path = typer.Option(_CACHE, "--cache-dir", help="Where the default model is built (env P2PRL_CACHE)."),
    columns: str = typer.Option(
        "node,vllm,pinned,cross",
        "--columns",
        help="Validator settings: node (calibrated on its own engine), vllm (calibrated on vLLM's reference "
        "batches, vLLM miners; where vLLM runs the model), pinned (a genesis's --pin-tolerances hf,hf-avx2; "
        "an AVX2 CPU's miners), cross (the uncalibrated cross-engine defaults).",
    ),
    cases: str = typer.Option("", "--cases", help="Comma list of cases (default: all)."),
    model: str = typer.Option(
        "tiny", "--model", help="tiny (default model), big (~24M configuration) or real (SmolLM2-135M-Instruct)."
    ),
    forward_float32: bool = typer.Option(
        False, "--forward-float32", help="Every validator recomputes in float32 (a CPU without bf16 kernels)."
    ),
) -> None:
    """Each cheat (cheaper or older weights, sharpened samplers, re-drawn batches, steering inside the
    margin, unrecomputed payloads, copy front-running, key grinding, drops at will) against a
    validator at node defaults and at a vLLM network's settings."""
    from p2prl.bench.cheats import CASES, COLUMNS, run

    def log(msg: str) -> None:
        if not as_json:
            typer.echo(msg)

    cols = tuple(c for c in columns.split(",") if c)
    chosen = tuple(c for c in cases.split(",") if c) or CASES
    bad = [c for c in cols if c not in COLUMNS] + [c for c in chosen if c not in CASES]
    if model not in ("tiny", "big", "real"):
        bad.append(model)
    if bad:
        raise typer.BadParameter(f"unknown: {', '.join(bad)}")
    result = run(
        cache_dir, rollouts, train_steps, log=log, columns=cols, cases=chosen, model_name=model,
        forward_float32=forward_float32,
    )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True, default=float))
        return
    for col, table in result["columns"].items():
        typer.echo(f"\n{col}: {'case':20s} {'accepted/n':>12s} {'gain':>6s} {'earned':>6s} {'trained':>8s}")
        for c in table:
            gain = f"{c['gain']:.2f}" if "gain" in c else "-"
            earned = f"{c['earned_gain']:.2f}" if "earned_gain" in c else "-"  # in accepted groups only
            trained = str(c["trained"]) if "trained" in c else "-"
            typer.echo(
                f"{'':{len(col) + 2}s}{c['case']:20s} {c['accepted']:>5d}/{c['n']:<6d} {gain:>6s} {earned:>6s} {trained:>8s}"
            )
    typer.echo(f"verify time / generation: {result['verify_fraction']:.1%}")


def bench_honest(
    rollouts: int = typer.Option(1700, "--rollouts", min=8, help="Honest rollouts per setting and model."),
    models: str = typer.Option(
        "tiny", "--models", help="Comma list of: tiny (default model), big (~24M), real (SmolLM2-135M-Instruct)."
    ),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Engine batch sizes."),
    threads: str = typer.Option("1,2", "--threads", help="Miner thread counts."),
    miner_device: str = typer.Option("cpu", "--miner-device", help="Torch device of the miner's engine."),
    validator_device: str = typer.Option(
        "cpu", "--validator-device", help="Torch device of the validator (it calibrates there)."
    ),
    train_steps: int = typer.Option(0, "--train-steps", min=0, help="Train the model this many steps first."),
    lr: float = typer.Option(3e-3, "--lr", help="Learning rate of those steps."),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", min=0, help="Completion length (0: default)."),
    engine: str = typer.Option("hf", "--engine", help="The miner's engine: hf or vllm (a vLLM miner)."),
    miner_isa: str = typer.Option(
        "", "--miner-isa", help="avx2: the miner runs an AVX2 CPU's kernels, the validator this CPU's."
    ),
    cache_dir: Path = typer.Option(_CACHE, "--cache-dir"),
) -> None:
    """Honest acceptance (the false-reject rate) across engine batch sizes, thread counts and devices."""
    from p2prl.bench.proof import honest_acceptance, miner_isas

    if miner_isa and miner_isa not in miner_isas():
        raise typer.BadParameter(f"--miner-isa must be one of {', '.join(miner_isas())}, not {miner_isa!r}")
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
        engine=engine,
        miner_isa=miner_isa,
    )
    typer.echo(json.dumps(result, sort_keys=True, default=float))


def bench_flood(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a summary."),
    seconds: float = typer.Option(30.0, "--seconds", min=5.0, help="Length of each phase."),
    every: float = typer.Option(1.5, "--every", min=0.2, help="Seconds between honest announcements."),
    miners: int = typer.Option(4, "--miners", min=1, help="Honest miners (keys)."),
    attackers: int = typer.Option(
        2, "--attackers", min=1, help="Attacker hosts, each at the per-peer limit."
    ),
    keys: int = typer.Option(500, "--keys", min=1, help="Signing keys per attacker host."),
    inject: bool = typer.Option(
        False,
        "--inject",
        help="Deliver the flood straight to the roles' handlers (full rate) instead of by gossip.",
    ),
    many_keys: bool = typer.Option(
        False,
        "--many-keys",
        help="The many-key case: a fresh key per judged junk batch, and replays of honest batches (injected).",
    ),
    processes: bool = typer.Option(
        False,
        "--processes",
        help="The trainer and the validator each in a process of its own, as the demo runs them (by gossip).",
    ),
    cache_dir: Path = typer.Option(
        _CACHE,
        "--cache-dir",
        help="Where the default model is built (env P2PRL_CACHE).",
    ),
) -> None:
    """Honest batches judged per minute and their latency, without and with an announcement flood."""
    from p2prl.bench.flood import FloodSpec, run

    def log(msg: str) -> None:
        if not as_json:
            typer.echo(msg)

    r = run(cache_dir, FloodSpec(seconds, every, miners, attackers, keys, inject, many_keys, processes), log=log)
    if as_json:
        typer.echo(json.dumps(r, sort_keys=True))
        return
    for name in ("no_flood", "flood"):
        p = r[name]
        p50, p95 = p["latency_p50_s"], p["latency_p95_s"]
        typer.echo(
            f"{name:9s} judged {p['judged']}/{p['announced']}  {p['per_minute']:.1f}/min  "
            f"latency p50 {p50 if p50 is None else round(p50, 2)} s  p95 {p95 if p95 is None else round(p95, 2)} s"
        )
    got = ", ".join(f"{k} {v:.0f}/s" for k, v in r["gossip_in_per_s_under_flood"].items())
    typer.echo(f"flood: {r['flood_msgs_per_s']:.0f} announcements/s offered; gossip arriving: {got}")
    if r["inject"]:
        typer.echo(f"injected into the handlers: {r['injected']} announcements")
    typer.echo(f"honest rate under flood: {r['ratio']:.0%} of unflooded")
    if r["many_keys"]:
        typer.echo(
            f"honest miners zeroed: {r['honest_miners_zeroed']}; judged pairs forgotten: {r['judged_forgotten']}"
        )
    typer.echo(
        f"validator: {r['validator_batches_checked']} batches judged, dropped {r['validator_dropped']}"
    )
    typer.echo(f"trainer dropped: {r['trainer_dropped']}")
    if r.get("gossip"):
        typer.echo(f"gossip (processes): {r['gossip']}")


def bench_trainer(
    steps: int = typer.Option(3, "--steps", min=1, help="Timed GRPO steps (after one warm-up step)."),
    groups: int = typer.Option(4, "--groups", min=1, help="Rollout groups per step."),
    group_size: int = typer.Option(8, "--group-size", min=2, help="Rollouts per group."),
    tokens: int = typer.Option(24, "--tokens", min=1, help="Completion tokens per rollout."),
    lr: float = typer.Option(1e-5, "--lr", help="AdamW learning rate."),
) -> None:
    """Step time, publish time and memory per rank of the ~24M-parameter learner; run under torchrun."""
    from p2prl.bench.trainer import run

    result = run(steps, groups, group_size, tokens, lr)
    if result is not None:
        typer.echo(json.dumps(result, sort_keys=True))


def bench_swarm_sim(
    peers: int = typer.Option(
        100, "--peers", min=1, help="Peers that fetch the patch (the trainer not counted)."
    ),
    patch_mib: float = typer.Option(16.0, "--patch-mib", min=0.01, help="Patch size in MiB."),
    chunk_kib: int = typer.Option(
        1024, "--chunk-kib", min=16, help="Chunk size in KiB (genesis default 1 MiB)."
    ),
    up_min: float = typer.Option(
        10.0, "--up-min-mbit", help="Slowest peer uplink (Mbit/s), log-uniform draw."
    ),
    up_max: float = typer.Option(1000.0, "--up-max-mbit", help="Fastest peer uplink (Mbit/s)."),
    link_mbit: float = typer.Option(0.0, "--link-mbit", help="> 0: every link this rate both ways, no NAT."),
    up_mbit: float = typer.Option(0.0, "--up-mbit", help="> 0: every peer's uplink this rate (asymmetric)."),
    trainer_mbit: float = typer.Option(
        1000.0, "--trainer-mbit", help="Trainer uplink and downlink (Mbit/s)."
    ),
    nat_share: float = typer.Option(0.5, "--nat-share", min=0.0, max=1.0, help="Share of peers behind NAT."),
    latency_ms: float = typer.Option(25.0, "--latency-ms", help="One-way latency of every message."),
    join_spread_s: float = typer.Option(0.0, "--join-spread-s", help="Peers join over this long."),
    cooldown_s: float = typer.Option(1.0, "--cooldown-s", help="Trainer superseed cooldown (0: off)."),
    cap_mb_s: float = typer.Option(0.0, "--cap-mb-s", help="Peers' upload cap, MB/s (0: none)."),
    fanout: int = typer.Option(4, "--tree-fanout", min=1, help="Children per relay-tree node."),
    provider_order: str = typer.Option(
        "node",
        "--provider-order",
        help="Providers after the trainer: 'node' (the node's own order per node and blob) or 'id' "
        "(lowest peer id first, the former order).",
    ),
    seed: int = typer.Option(1, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Simulate one patch's fan-out with the swarm's own chunk logic, against a star and a relay tree."""
    from p2prl.netsim import PROVIDER_ORDERS, Spec, run_all

    if provider_order not in PROVIDER_ORDERS:
        raise typer.BadParameter(" or ".join(PROVIDER_ORDERS), param_hint="--provider-order")

    spec = Spec(
        peers=peers,
        patch_mib=patch_mib,
        chunk_kib=chunk_kib,
        up_mbit=(up_min, up_max),
        link_mbit=link_mbit,
        up_override_mbit=up_mbit,
        trainer_mbit=trainer_mbit,
        nat_share=nat_share,
        latency_s=latency_ms / 1000,
        join_spread_s=join_spread_s,
        seed=seed,
    )
    res = run_all(
        spec, fanout=fanout, cooldown_s=cooldown_s, cap_mb_s=cap_mb_s, provider_order=provider_order
    )
    if as_json:
        typer.echo(json.dumps(res, indent=1))
        return
    typer.echo(f"{peers} peers, {patch_mib} MiB patch, {res['nat_peers']} behind NAT")
    for name in ("swarm", "star", "tree"):
        r = res[name]
        typer.echo(
            f"{name:6} trainer upload {r['trainer_upload_x']:>8}x  t50 {r['t50_s']} s  t90 {r['t90_s']} s  "
            f"t100 {r['t100_s']} s  complete {r['complete']}/{peers}"
        )


def bench_dishonest_miner(config: Path | None = None, perturb: float = 0.05, **flags: Any) -> None:
    """Run a miner node that generates with perturbed weights (the demo's cheater: every group it
    announces must be rejected). Takes the ``p2prl node`` options; the role is always miner."""

    from p2prl.bench.dishonest import dishonest_miner
    from p2prl.cli.node import run_configured

    run_configured(config, {**flags, "role": "miner"}, dishonest_miner(perturb))


bench_dishonest_miner.__signature__ = node_signature(  # type: ignore[attr-defined]
    inspect.Parameter(
        "perturb",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=float,
        default=typer.Option(
            0.05, "--perturb", min=1e-6, help="Noise added to every weight, relative to its tensor's std."
        ),
    )
)

def bench_engine_update(
    engine: str = typer.Option("hf", "--engine", help="hf or vllm."),
    model: Path | None = typer.Option(
        None,
        "--model",
        help="Local Hugging Face model directory (default: a random Qwen3 of head size 64, built in the cache).",
    ),
    versions: int = typer.Option(10, "--versions", help="Trainer versions switched to in place."),
    reloads: int = typer.Option(2, "--reloads", help="Fresh engines started on new weights, to compare."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    lr: float = typer.Option(1e-5, "--lr", help="The trainer's learning rate (how much each version changes)."),
    separate: bool = typer.Option(
        False, "--separate", help="hf: the engine keeps its own copy, written per switch (as on CUDA)."
    ),
    density: float = typer.Option(
        0.0, "--density", min=0.0, max=1.0, help="No GRPO step: each version moves this fraction of elements."
    ),
    hash_first: bool = typer.Option(
        False, "--hash-first", help="Hash the result before the swap (a validator's switch), not after it (a miner's)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A version switch in place (signed patch in hand → first token) against a fresh engine on the new
    weights: time, generation pause, extra memory, and when the result's hash confirmed it; the
    engine's weights hash checked every version."""
    from p2prl.bench.engine_update import run
    from p2prl.rl import VLLM_TINY, build_random_model_dir

    if model is None:
        model = _CACHE / "engine-update-qwen3-h64"
        if not (model / "config.json").is_file():
            build_random_model_dir(model, "qwen3", shape=VLLM_TINY)
    r = run(
        engine,
        model,
        versions=versions,
        device=device,
        reloads=reloads,
        lr=lr,
        separate=separate,
        density=density,
        hash_first=hash_first,
    )
    if as_json:
        typer.echo(json.dumps(r, indent=1))
        return
    ratio = r["in_place_vs_reload"]
    confirmed = "" if hash_first else f"hash confirmed beside generation {r['confirm_s'] * 1e3:.0f} ms after the pause; "
    reload = f"reload {r['reload_s']:.2f} s, ratio {ratio:.4f}" if ratio is not None else "no reload measured"
    typer.echo(
        f"{r['engine']} on {r['device']}{' (own copy)' if r['separate_copy'] else ''}, "
        f"{r['parameters'] / 1e6:.2f}M params, {r['versions']} versions at "
        f"{f'density {density:g}' if density else f'lr {lr:g}'} (elements written {r['written_fraction']:.4f}): "
        f"trainer publish {r['publish_s'] * 1e3:.0f} ms; switch {r['switch_s'] * 1e3:.0f} ms "
        f"({'check' if hash_first else 'decode'} beside generation {r['check_s'] * 1e3:.0f} ms, "
        f"generation paused {r['pause_s'] * 1e3:.1f} ms); "
        f"{confirmed}"
        f"in place {r['in_place_s'] * 1e3:.1f} ms, "
        f"{reload}; engine hash = trainer's every version: "
        f"{r['engine_hash_ok_every_version']}"
    )


app.command("patch")(bench_patch)
app.command("patch-cli")(bench_patch_cli)
app.command("fanout")(bench_fanout)
app.command("proof")(bench_proof)
app.command("honest")(bench_honest)
app.command("cheats")(bench_cheats)
app.command("flood")(bench_flood)
app.command("trainer")(bench_trainer)
app.command("swarm-sim")(bench_swarm_sim)
app.command("engine-update")(bench_engine_update)
app.command("dishonest-miner", hidden=True, no_args_is_help=False)(bench_dishonest_miner)


@app.command("memory")
def bench_memory(
    sizes: str = typer.Option(
        "s,m,l", "--sizes", help="Comma-separated sizes from p2prl.bench.memory.SHAPES."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Peak RSS of each role's model work (miner, validator, trainer) against parameter count."""
    import json

    from p2prl.bench.memory import run_memory_bench

    rows = run_memory_bench(tuple(s for s in sizes.split(",") if s))
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    typer.echo(
        f"{'size':4} {'role':9} {'params':>11} {'bf16 MiB':>9} {'base MiB':>9} {'peak MiB':>9} {'added/bf16':>10}"
    )
    for r in rows:
        added = (r["peak_mib"] - r["baseline_mib"]) / r["bf16_mib"]
        typer.echo(
            f"{r['size']:4} {r['role']:9} {r['parameters']:>11,} {r['bf16_mib']:>9.1f} {r['baseline_mib']:>9.1f} "
            f"{r['peak_mib']:>9.1f} {added:>10.2f}"
        )


@app.command("scale")
def bench_scale(
    scale: str = typer.Option(
        "0.5b", "--scale", help="Model shape: 0.5b (Qwen2.5-0.5B's layers), or m, s, tiny for quick runs."
    ),
    versions: int = typer.Option(3, "--versions", min=1, help="Versions to publish and follow."),
    groups: int = typer.Option(2, "--groups", min=1, help="Groups per miner batch and per GRPO step."),
    group_size: int = typer.Option(4, "--group-size", min=2, help="Samples per prompt."),
    new_tokens: int = typer.Option(8, "--new-tokens", min=1, help="Completion length bound."),
    lr: float = typer.Option(1e-6, "--lr", help="Trainer learning rate (sets how many elements change)."),
    timeout_s: float = typer.Option(3600.0, "--timeout-s", help="Give up after this long."),
    workdir: str = typer.Option("", "--dir", help="Work directory (kept); default: a temporary one."),
) -> None:
    """Per version through real trainer, validator and miner processes: GRPO step, patch encode,
    transfer, apply + verify, validation, peak RSS per role, patch size and bits per changed element."""
    import sys

    from p2prl.demo import ScaleOptions, run_scale_bench

    opts = ScaleOptions(
        scale=scale,
        versions=versions,
        groups=groups,
        group_size=group_size,
        new_tokens=new_tokens,
        lr=lr,
        timeout_s=timeout_s,
        workdir=Path(workdir) if workdir else None,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    try:
        report = run_scale_bench(opts)
    except (RuntimeError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(report, indent=1))
