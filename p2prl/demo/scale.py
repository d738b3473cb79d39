"""``p2prl bench scale``: a Qwen2.5-0.5B-shaped model through real trainer, validator and miner processes.

The model is random-init (``p2prl.rl.randmodel``: Qwen2.5-0.5B's layer shapes, a trained 400-token BPE
vocabulary); the task is ``digit-start``, which a random model earns on a fair share of its samples,
so every batch has reward variance and the trainer takes real GRPO steps. Each node is a
``p2prl node`` process on 127.0.0.1 (peer to peer, no S3) as ``p2prl demo`` starts them. The bench
polls every node's status and reads, per version, what the node measured itself: the trainer's GRPO
step and patch encode, the miner's and validator's fetch (transfer) and verify + in-place apply, the
validator's check of a batch; peak RSS is each process's ``VmHWM``; patch size and bits per changed
element come from the trainer's own patch blobs afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES: dict[str, dict[str, int]] = {  # layer shapes; the vocabulary is the trained 400-token one
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
    "s": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4},
    "m": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8},
}
NODES = ("trainer", "validator", "miner1")


@dataclass
class ScaleOptions:
    scale: str = "0.5b"
    versions: int = 3
    groups: int = 2  # per miner batch and per GRPO step
    group_size: int = 4
    new_tokens: int = 8
    lr: float = 1e-6  # an RL fine-tuning rate: about 1% of the bf16 elements change per step
    timeout_s: float = 3600.0
    stall_s: float = 600.0  # no node moved a version and no batch was checked for this long: give up
    workdir: Path | None = None
    keep: bool = False
    torch_threads: int = 1
    log: Any = field(default=print)


def model_shape(scale: str) -> dict[str, int]:
    from p2prl.rl import QWEN25_05B, TINY

    if scale == "0.5b":
        return dict(QWEN25_05B)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of 0.5b, {', '.join(SCALES)}")
    return {**TINY, "num_attention_heads": 8, "num_key_value_heads": 2, **SCALES[scale]}


def kv_cache_mib(shape: dict[str, int], rows: int, tokens: int) -> float:
    """The bf16 KV cache of ``rows`` sequences of ``tokens`` tokens: keys and values, every layer."""
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return (
        2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * rows * tokens * 2 / 2**20
    )


def _vm_hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Recorder:
    """Per-version figures from the nodes' status, as each node reaches a version."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.seen: dict[str, int] = {}
        self.checks: dict[int, list[float]] = {}
        self.checked = 0
        self.peak: dict[str, float] = {}
        self.steps = 0

    def row(self, v: int) -> dict[str, Any]:
        return self.rows.setdefault(v, {"version": v})

    def observe(self, name: str, st: dict[str, Any] | None, now: float) -> None:
        if not st:
            return
        v, g = int(st.get("version", -1)), st.get("gauges", {})
        if name == "validator":
            n = int(st.get("counters", {}).get("batches_checked", 0))
            if n > self.checked and "check_ms" in g:
                self.checks.setdefault(v, []).append(float(g["check_ms"]))
                self.checked = n
        if v <= self.seen.get(name, 0) or v < 1:
            return
        self.seen[name] = v
        r = self.row(v)
        if name == "trainer":  # the gauges of the step and encode behind this version (set before it)
            steps = int(st.get("counters", {}).get("train_steps", 0))
            r["published_at_s"] = round(now, 2)
            r["grpo_step_ms"] = _ms(g.get("train_step_ms"))
            r["grpo_steps"] = steps - self.steps
            r["patch_encode_ms"] = _ms(g.get("patch_encode_ms"))
            self.steps = steps
        else:
            role = "miner" if name.startswith("miner") else name
            r[f"{role}_at_s"] = round(now, 2)
            r[f"{role}_transfer_ms"] = _ms(g.get("patch_fetch_ms"))
            r[f"{role}_apply_verify_ms"] = _ms(g.get("patch_apply_ms"))


def _ms(x: Any) -> float | None:
    return round(float(x), 1) if isinstance(x, (int, float)) else None


def patch_stats(root: Path, network_id: str, trainer_key: bytes) -> dict[int, dict[str, Any]]:
    """Size, changed elements and bits per changed element of each delta the trainer published."""
    from p2prl.patch import inspect_patch, open_manifest
    from p2prl.store import BlobStore

    store = BlobStore(root / "trainer" / "blobs")
    out: dict[int, dict[str, Any]] = {}
    for f in sorted((root / "trainer" / "trainer" / "chain" / "manifests").glob("*-delta.env")):
        m = open_manifest(f.read_bytes(), network_id, trainer_key)
        if not store.has(m.blob.id):
            continue
        info = inspect_patch(store.get(m.blob.id))
        out[m.version] = {
            "patch_bytes": info["bytes"],
            "changed": info["changed"],
            "changed_fraction": round(info["changed_fraction"], 5),
            "bits_per_changed": round(info["bits_per_changed"], 2),
        }
    return out


def run_scale_bench(opts: ScaleOptions) -> dict[str, Any]:
    """Build the model, run the network until the miner and validator hold ``opts.versions``; the report."""
    from p2prl.demo.launcher import DemoOptions, _node_args, _statuses, prepare, wait_up
    from p2prl.demo.supervisor import Supervisor
    from p2prl.rl import build_random_model_dir

    shape = model_shape(opts.scale)
    tmp = Path(tempfile.mkdtemp(prefix="p2prl-scale-")) if opts.workdir is None else None
    root = Path(opts.workdir or tmp)  # type: ignore[arg-type]
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    try:
        t0 = time.monotonic()
        model_dir = root / "model"
        if not (model_dir / "config.json").exists():
            build_random_model_dir(model_dir, "qwen2", shape=shape)
        opts.log(f"model {model_dir} built in {time.monotonic() - t0:.0f} s")
        demo = DemoOptions(
            miners=1,
            model=model_dir,
            task="digit-start",
            max_new_tokens=opts.new_tokens,
            group_size=opts.group_size,
            groups_per_batch=opts.groups,
            train_batch_groups=opts.groups,
            train_epochs=1,
            lr=opts.lr,
            batches_per_version=1,
            min_publish_s=0.0,
            anchor_interval=1000,  # deltas only after version 0
            checkpoint_every=1000,
            max_staleness=1,
            torch_threads=opts.torch_threads,
            model_cache=root / "cache",
            node_args=("--max-versions", str(opts.versions), "--keep-states", "2"),
        )
        plan = prepare(demo, root, "")
        names = list(NODES)
        rec = _Recorder()
        with Supervisor(root) as sup:
            for n in names:
                sup.spawn(n, _node_args(demo, root, plan, n, ""))
            wait_up(sup, lambda: _statuses(plan, names), opts.timeout_s, stop)
            start = time.monotonic()
            opts.log(f"nodes up in {start - t0:.0f} s")
            last_seen: tuple[Any, ...] = ()
            moved = 0.0
            while True:
                now = time.monotonic() - start
                sts = _statuses(plan, names)
                for n in names:
                    rec.observe(n, sts[n], now)
                for c in sup.children:
                    rec.peak[c.name] = max(rec.peak.get(c.name, 0.0), _vm_hwm_mib(c.proc.pid))
                    if not c.alive:
                        raise RuntimeError(f"{c.name} exited with {c.proc.returncode}:\n{c.tail()}")
                if all(rec.seen.get(n, 0) >= opts.versions for n in names) and rec.checks.get(opts.versions):
                    break
                seen = (tuple(sorted(rec.seen.items())), rec.checked)
                if seen != last_seen:
                    last_seen, moved = seen, now
                if now > opts.timeout_s or now - moved > opts.stall_s:
                    why = f"not at v{opts.versions} after {now:.0f} s ({now - moved:.0f} s without progress)"
                    tails = "\n".join(f"--- {c.name}\n{c.tail(12)}" for c in sup.children)
                    raise RuntimeError(f"{why}: {rec.seen}\n{tails}")
                time.sleep(0.25)
        from p2prl.node import read_genesis

        sg = read_genesis(plan["genesis"])
        stats = patch_stats(root, sg.network_id, sg.trainer_key)
        return _report(opts, shape, rec, stats, model_dir)
    finally:
        if tmp is not None and not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def parameter_count(model_dir: Path) -> int:
    """Elements in the directory's safetensors files (tied weights are stored once)."""
    from math import prod

    from safetensors import safe_open

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            n += sum(prod(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118
    return n


def _report(
    opts: ScaleOptions,
    shape: dict[str, int],
    rec: _Recorder,
    stats: dict[int, dict[str, Any]],
    model_dir: Path,
) -> dict[str, Any]:
    params = parameter_count(model_dir)
    bf16 = params * 2 / 2**20
    rows = opts.groups * opts.group_size
    kv_mib = kv_cache_mib(shape, rows, 32 + opts.new_tokens)
    versions = []
    prev = 0.0
    for v in range(1, opts.versions + 1):
        r = {**rec.rows.get(v, {"version": v}), **stats.get(v, {})}
        checks = rec.checks.get(v, [])
        r["validation_ms"] = round(sum(checks) / len(checks), 1) if checks else None
        at = r.get("published_at_s")
        r["version_wall_s"] = round(at - prev, 2) if at is not None else None
        prev = at if at is not None else prev
        parts = ("patch_encode_ms", "miner_transfer_ms", "miner_apply_verify_ms", "validation_ms")
        if r["version_wall_s"] and all(r.get(k) is not None for k in parts):
            # everything but the GRPO step and generation (taken one after another: an upper bound)
            r["overhead_fraction"] = round(sum(r[k] for k in parts) / 1000 / r["version_wall_s"], 3)
        versions.append(r)
    peak = {("miner" if n.startswith("miner") else n): round(mib, 1) for n, mib in rec.peak.items()}
    return {
        "scale": opts.scale,
        "shape": shape,
        "parameters": params,
        "bf16_mib": round(bf16, 1),
        "kv_cache_mib": round(kv_mib, 2),
        "batch": {"groups": opts.groups, "group_size": opts.group_size, "new_tokens": opts.new_tokens},
        "versions": versions,
        "peak_rss_mib": peak,
        "lr": opts.lr,
        "miner_peak_over_bf16_plus_kv": round(peak.get("miner", 0.0) / (bf16 + kv_mib), 2),
    }
