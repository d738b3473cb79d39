"""``python -m p2prl.bench.gpu`` (``scripts/gpu-check.sh``): does this GPU run p2prl's miner honestly?

One command for a volunteer or a lent GPU machine, printing one table:

- honest miner on the GPU, judged by a validator on the GPU and by one on the CPU (each calibrated on
  its own device, as a node does): every rollout must be accepted;
- generation against verification on a Qwen2.5-0.5B-shaped model (what share of the miner's work
  the validator redoes, at its default sample and recomputing everything);
- a version switch: a signed patch applied in place to the running engine, against a fresh engine,
  with the engine's weights hash checked against the trainer's every version; then the same at
  Qwen2.5-0.5B's shape with 1.3% and 50% of the elements changed per version (the engine's copy on
  the GPU written with the changed elements only), the trainer's publish beside it.

The switches run first (seconds), the honest miners last (minutes).

It calls the benchmark functions directly, not through the CLI, so it runs in an existing CUDA
environment whatever its typer, with only the packages the proof code imports. ``--device cpu``
runs the same checks on the CPU (``--quick``: small sizes, for the test suite); asked for CUDA
where there is none it prints one ``no CUDA device`` line and exits 3. Each check's record is written
as JSON under ``--out`` as soon as it ends, so a run cut short keeps what finished.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_NO_CUDA, EXIT_MISSING = 1, 3, 4
# What the proof, engine and patch code import beyond torch and transformers (import name -> PyPI name).
NEEDED = {
    "transformers": "transformers",
    "safetensors": "safetensors",
    "nacl": "pynacl",
    "blake3": "blake3",
    "zstandard": "zstandard",
    "trio": "trio",
}


@dataclass
class Row:
    check: str
    where: str
    ok: bool
    result: str
    seconds: float
    record: dict[str, Any]


@dataclass(frozen=True)
class Sizes:
    honest_models: tuple[str, ...]
    honest_rollouts: int
    train_steps: int
    shape_layers: int  # 0: Qwen2.5-0.5B's own shape
    new_tokens: int
    groups: int
    versions: int
    reloads: int
    big_switch_densities: tuple[float, ...]  # the 0.5B-shaped switch: fractions changed per version
    big_switch_lrs: tuple[float, ...]  # and versions from a real GRPO learner at these learning rates


FULL = Sizes(("tiny", "big"), 512, 50, 0, 128, 32, 10, 2, (0.013, 0.5), (1e-6, 1e-5))
QUICK = Sizes(("tiny",), 16, 0, 1, 8, 1, 2, 1, (0.013,), (1e-5,))


def missing_packages() -> list[str]:
    return [pypi for mod, pypi in NEEDED.items() if importlib.util.find_spec(mod) is None]


def cuda_line() -> tuple[bool, str]:
    """(CUDA usable, one line saying what torch sees)."""
    import torch

    built = torch.version.cuda
    if not torch.cuda.is_available():
        why = (
            f"torch {torch.__version__} built for CUDA {built}"
            if built
            else f"torch {torch.__version__} is a CPU build"
        )
        return False, f"no CUDA device: {why}, torch.cuda.is_available() is False"
    name = torch.cuda.get_device_name(0)
    mem = torch.cuda.get_device_properties(0).total_memory / 2**30
    return True, f"CUDA device: {name} ({mem:.0f} GiB), torch {torch.__version__}, CUDA {built}"


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_honest(cache: Path, device: str, validator: str, sizes: Sizes, log: Callable[[str], None]) -> Row:
    from p2prl.bench.proof import honest_acceptance

    t = time.perf_counter()
    r = honest_acceptance(
        cache,
        sizes.honest_rollouts,
        sizes.honest_models,
        batch_sizes=(32,),
        threads=(0,),
        log=log,
        miner_device=device,
        validator_device=validator,
        train_steps=sizes.train_steps,
    )
    worst = max(
        (
            s["fingerprint_err_quantile"] / m["tolerances"]["fingerprint_tol"]
            for m in r["models"].values()
            for s in m["settings"]
        ),
        default=0.0,
    )
    result = f"{r['accepted']}/{r['rollouts']} accepted; worst fingerprint error {worst:.2f} of tolerance"
    return Row(
        f"honest miner ({','.join(sizes.honest_models)})",
        f"miner {device}, validator {validator}",
        r["rollouts"] > 0 and r["false_rejects"] == 0,
        result,
        time.perf_counter() - t,
        r,
    )


def check_verify_cost(device: str, sizes: Sizes) -> Row:
    """Generation against verification on Qwen2.5-0.5B's shape (char vocabulary: 358M parameters)."""
    from p2prl.bench.proof import GROUP_SIZE, MINER_A, generation_spec, manifest_of
    from p2prl.proof.miner import mine_batch
    from p2prl.proof.validate import RolloutValidator, ValidatorConfig
    from p2prl.rl import QWEN25_05B, CharTokenizer, GenerationParams, HFEngine
    from p2prl.rl.model import random_qwen2
    from p2prl.rl.tasks import get_task

    t = time.perf_counter()
    tok, task = CharTokenizer(), get_task("addition", digits=2)
    arch = dict(QWEN25_05B)
    if sizes.shape_layers:
        arch.update(
            num_hidden_layers=sizes.shape_layers,
            hidden_size=128,
            num_attention_heads=2,
            intermediate_size=256,
        )
    model = random_qwen2(arch, tok.vocab_size, 0).to(device)
    mh = manifest_of(model)
    params = GenerationParams(max_new_tokens=sizes.new_tokens, temperature=1.0)
    engine = HFEngine(model, tok, max_batch=512)
    rec: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "new_tokens": sizes.new_tokens,
    }
    for rep in range(2):  # the first is the warm-up (CUDA kernels, allocator)
        idx = list(range(sizes.groups * rep, sizes.groups * (rep + 1)))
        _sync(device)
        t0 = time.perf_counter()
        pb = mine_batch(engine, task, 5, mh, MINER_A, idx, GROUP_SIZE, replace(params, seed=rep))
        _sync(device)
        rec.update(
            generate_s=time.perf_counter() - t0,
            rollouts=pb.batch.n_rollouts,
            tokens=pb.batch.n_completion_tokens,
        )
        for label, checked in (("default", 2), ("all", 0)):
            cfg = ValidatorConfig(
                generation=generation_spec(params, groups_per_batch=sizes.groups),
                fixed_group_count=False,
                checked_per_group=checked,
                contiguous_indices=False,
            )
            v = RolloutValidator.for_model(model, tok, task, 5, mh, config=cfg)
            t0 = time.perf_counter()
            verdict = v.check(pb.announcement, MINER_A, pb.blob, 5)
            _sync(device)
            rec[f"verify_{label}_s"] = time.perf_counter() - t0
            rec[f"verify_{label}_accepted"] = verdict.accepted_rollouts
            rec[f"verify_{label}_reasons"] = verdict.reasons()
    gen = rec["generate_s"]
    ok = rec["verify_default_accepted"] == rec["verify_all_accepted"] == rec["rollouts"]
    result = (
        f"{rec['parameters'] / 1e6:.1f}M params, {rec['rollouts']} x {sizes.new_tokens} tokens: generate {gen:.2f} s "
        f"({rec['tokens'] / gen:,.0f} tok/s), verify {rec['verify_default_s']:.2f} s = "
        f"{rec['verify_default_s'] / gen:.0%} (all rollouts {rec['verify_all_s'] / gen:.0%}); "
        f"accepted {rec['verify_default_accepted']}/{rec['rollouts']}"
    )
    del model, engine
    return Row("verify vs generate (0.5B shape)", device, ok, result, time.perf_counter() - t, rec)


def _model_dir(cache: Path, name: str, shape: dict[str, int]) -> Path:
    """A random Qwen3 of ``shape`` under ``cache`` (built aside and renamed: the cache may be shared)."""
    from p2prl.rl import build_random_model_dir

    model = cache / name
    if not (model / "config.json").is_file():
        tmp = build_random_model_dir(model.with_name(f".{model.name}.{os.getpid()}"), "qwen3", shape=shape)
        try:
            tmp.rename(model)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    return model


def check_switch(cache: Path, device: str, engine: str, sizes: Sizes) -> Row:
    from p2prl.bench.engine_update import run
    from p2prl.rl import VLLM_TINY

    t = time.perf_counter()
    model = _model_dir(cache, "engine-update-qwen3-h64", VLLM_TINY)  # the one `bench engine-update` builds
    r = run(engine, model, versions=sizes.versions, device=device, reloads=sizes.reloads)
    r.pop("per_version", None)
    reload = f"fresh engine {r['reload_s']:.2f} s" if r["reload_s"] is not None else "no reload measured"
    result = (
        f"{r['versions']} versions in place {r['in_place_s'] * 1e3:.0f} ms (pause {r['pause_s'] * 1e3:.0f} ms), "
        f"{reload}; engine hash = trainer's every version: {r['engine_hash_ok_every_version']}"
    )
    return Row(
        f"version switch ({engine})",
        device,
        bool(r["engine_hash_ok_every_version"]),
        result,
        time.perf_counter() - t,
        r,
    )


def check_big_switch(cache: Path, device: str, sizes: Sizes, log: Callable[[str], None]) -> Row:
    """The transformers engine at Qwen2.5-0.5B's shape (362M as a Qwen3), each version changing a
    seeded fraction of the bf16 elements (0.013: what an AdamW step at lr 1e-6 changes; 0.5: near
    dense), then a real GRPO learner's versions at each of ``big_switch_lrs`` (1.5% and 15% changed);
    the node's copy on the CPU, the engine's own on ``device`` written with the changed elements only.
    The trainer's publish is timed beside it."""
    from p2prl.bench.engine_update import run
    from p2prl.rl import QWEN25_05B

    t = time.perf_counter()
    shape = dict(QWEN25_05B)
    if sizes.shape_layers:
        shape.update(num_hidden_layers=sizes.shape_layers, hidden_size=128, num_attention_heads=2)
        shape.update(intermediate_size=256, num_key_value_heads=1)
    model = _model_dir(cache, f"engine-update-qwen3-05b-{sizes.shape_layers or 'full'}", shape)
    rec: dict[str, Any] = {}
    parts, ok = [], True
    d0, *more = sizes.big_switch_densities
    runs: list[tuple[str, str, dict[str, Any]]] = [
        (f"{d0:.1%} changed", str(d0), {"density": d0}),
        # back to back: the same switch hashed before the swap (a validator's)
        (f"{d0:.1%} changed, hashed first", f"{d0}-hash-first", {"density": d0, "hash_first": True}),
    ]
    runs += [(f"lr {lr:g}", f"lr{lr:g}", {"lr": lr}) for lr in sizes.big_switch_lrs]
    runs += [(f"{d:.1%} changed", str(d), {"density": d}) for d in more]
    for label, key, how in runs:
        r = run("hf", model, versions=3, device=device, reloads=1, separate=True, **how)
        rows = r.pop("per_version")
        r["written_mb"] = [x["written_bytes"] / 1e6 for x in rows]
        rec[key] = r
        ok = ok and bool(r["engine_hash_ok_every_version"])
        parts.append(
            f"{label} ({r['written_fraction']:.1%}): switch {r['switch_s'] * 1e3:.0f} ms (check {r['check_s'] * 1e3:.0f} ms beside "
            f"generation; pause {r['pause_s'] * 1e3:.0f} ms, of it engine write {r['engine_write_s'] * 1e3:.0f} ms "
            f"of {statistics.median(r['written_mb']):.0f} MB; hash confirmed {r['confirm_s'] * 1e3:.0f} ms later) "
            f"vs fresh {r['reload_s']:.2f} s, publish {r['publish_s']:.2f} s"
        )
        log(f"   {parts[-1]}")  # each as it ends: a run cut short still shows the first
    params = next(iter(rec.values()))["parameters"] if rec else 0
    result = f"{params / 1e6:.0f}M: " + "; ".join(parts) + f"; engine hash = trainer's every version: {ok}"
    return Row("version switch (hf, 0.5B shape)", device, ok, result, time.perf_counter() - t, rec)


def table(rows: list[Row]) -> str:
    head = ("check", "where", "ok", "seconds", "result")
    cells = [(r.check, r.where, "ok" if r.ok else "FAIL", f"{r.seconds:.0f}", r.result) for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in [head, *cells]]
    return "\n".join(lines)


def run_checks(
    device: str,
    sizes: Sizes,
    cache: Path,
    out: Path | None,
    vllm: bool,
    log: Callable[[str], None],
    only: frozenset[str] = frozenset(),
) -> list[Row]:
    """Every check in turn; one that raises is a failed row with its error, and the rest still run."""
    checks: list[tuple[str, str, Callable[[], Row]]] = [
        ("switch_hf", device, lambda: check_switch(cache, device, "hf", sizes)),
        ("switch_hf_05b", device, lambda: check_big_switch(cache, device, sizes, log)),
        ("verify_cost", device, lambda: check_verify_cost(device, sizes)),
        (
            "honest_same_device",
            f"miner {device}, validator {device}",
            lambda: check_honest(cache, device, device, sizes, log),
        ),
    ]
    if device != "cpu":
        checks.append(
            (
                "honest_cpu_validator",
                f"miner {device}, validator cpu",
                lambda: check_honest(cache, device, "cpu", sizes, log),
            )
        )
    if vllm:
        checks.append(("switch_vllm", device, lambda: check_switch(cache, device, "vllm", sizes)))
    rows = []
    for name, where, fn in checks:
        if only and name not in only:
            continue
        t = time.perf_counter()
        log(f"-- {name} ...")
        try:
            row = fn()
        except Exception as e:  # a check that cannot run is a failed row, not the end of the run
            row = Row(
                name,
                where,
                False,
                f"error: {type(e).__name__}: {e}"[:300],
                time.perf_counter() - t,
                {"traceback": traceback.format_exc()[-4000:]},
            )
        rows.append(row)
        log(f"-- {name}: {'ok' if row.ok else 'FAIL'} {row.result}")
        if out is not None:
            (out / f"{name}.json").write_text(json.dumps(asdict(row), indent=1, default=str))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device", default="cuda", help="cuda (default), cuda:N, or cpu (the same checks on the CPU)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="small sizes (seconds on a CPU): checks the check itself"
    )
    ap.add_argument("--vllm", action="store_true", help="also switch versions in a running vLLM engine")
    ap.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl"))
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
        help="directory for each check's JSON record (default: $OUT when set)",
    )
    ap.add_argument("--quiet", action="store_true", help="only the device line and the table")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated checks to run (switch_hf, switch_hf_05b, verify_cost, honest_same_device, "
        "honest_cpu_validator, switch_vllm); default all",
    )
    args = ap.parse_args(argv)

    missing = missing_packages()
    if missing:
        print(
            f"missing Python packages: {' '.join(missing)} (pip install {' '.join(missing)}; "
            "with no package index: scripts/gpu-check.sh --download-wheels DIR where there is one, "
            "then --wheels DIR here)"
        )
        return EXIT_MISSING
    has_cuda, line = cuda_line()
    print(line, flush=True)
    if args.device.startswith("cuda") and not has_cuda:
        print("run the CPU parts with --device cpu")
        return EXIT_NO_CUDA
    import transformers

    print(
        f"python {sys.version.split()[0]}, transformers {transformers.__version__}, device {args.device}",
        flush=True,
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    log = (lambda _: None) if args.quiet else (lambda m: print(m, flush=True))
    only = frozenset(x for x in args.only.split(",") if x)
    rows = run_checks(args.device, QUICK if args.quick else FULL, args.cache, args.out, args.vllm, log, only)
    print(table(rows), flush=True)
    failed = [r.check for r in rows if not r.ok]
    print(f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
