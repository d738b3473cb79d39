"""``p2prl demo``: a whole network on 127.0.0.1 — local S3, trainer, validator, miners — in one command.

Each node is its own process (``p2prl node``), exactly as on separate machines; the demo only
creates the keys and the genesis, starts the processes, shows the dashboard (or waits), and at the
end quiesces the trainer (SIGUSR1: stop publishing, keep serving) so the miners can catch up before
it reads everyone's status into the summary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2prl.crypto import load_or_create_identity
from p2prl.dashboard import (
    fetch_status,
    mean_reward,
    per_version,
    reward_ends,
    reward_series,
    run_dashboard,
    run_report,
)
from p2prl.demo.sizing import step_size
from p2prl.demo.supervisor import Supervisor, s3_missing
from p2prl.net import free_port, peer_id_for
from p2prl.node import NetworkSpec, describe_model, genesis_from_spec, write_genesis
from p2prl.reasons import VerdictReason
from p2prl.rl import pin_task_params

log = logging.getLogger(__name__)

BUCKET = "p2prl-demo"
NETWORK_ID = "p2prl-demo"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class DemoOptions:
    duration: float | None = None
    summary_json: Path | None = None
    dishonest_miner: bool = False
    miners: int = 2
    workdir: Path | None = None
    keep: bool = False
    dashboard: bool = True
    # network settings: small, so a 2-core CPU learns within minutes
    max_new_tokens: int = 0  # 0: the model's (4 for the built-in model; p2prl.rl.gendefaults)
    group_size: int = 8
    groups_per_batch: int = 0  # 0: the model's step size (p2prl.demo.sizing, ``sized``), as below
    anchor_interval: int = 10
    max_staleness: int = 3  # the demo's own; a network made without one: DEFAULT_MAX_STALENESS (4)
    chunk_size: int = 256 * 1024
    torch_threads: int = 1
    catch_up_s: float = 60.0
    startup_timeout_s: float = 300.0
    node_args: tuple[str, ...] = ()  # extra flags for every node (tests)
    model_cache: Path | None = None  # default: $P2PRL_CACHE or ~/.cache/p2prl (the model is built once)
    model: Path | None = None  # a local HF directory instead of the built-in model
    task: str = "addition"
    task_params: dict[str, Any] = field(default_factory=dict)  # unset ones: the model's defaults
    prompt_format: str | None = None  # None: chat when the model's tokenizer has a template, else raw
    system_prompt: str = ""
    eval_problems: int = -1  # held-out greedy evaluation at the end; -1: 256 (built-in model) / 32; 0: none
    device: str = "cpu"
    validator_device: str | None = None  # default: ``device`` (a CUDA network judged on the CPU, say)
    engine: str = "auto"  # the miners' rollout engine: auto, hf or vllm (node --engine)
    # the trainer's step (train_batch_groups prompts x group_size samples, taken train_epochs times)
    # and each miner's batches_per_version batches of groups_per_batch prompts per version, sized
    # together so staleness stays 0-1 (p2prl.demo.sizing); 0: the model's
    lr: float = 0.0  # 0: 3e-4 for the built-in model, p2prl.rl.gendefaults.MODEL_LR with --model
    train_batch_groups: int = 0
    train_epochs: int = 0
    batches_per_version: int = 0
    min_publish_s: float = 1.0  # every version costs each node a patch fetch, apply and hash
    checkpoint_every: int = 10
    progress_s: float = 5.0  # headless: one progress line this often


def _default_cache() -> Path:
    from p2prl.rl import default_cache_dir  # its module imports torch: not at the demo's start

    return default_cache_dir()


def sized(opts: DemoOptions) -> DemoOptions:
    """``opts`` with every unset (0) step-size field taken from the model's step size: the toy's
    for the built-in model, a pretrained model's with ``--model`` (its step on a 2-core CPU takes
    half a minute, the toy's would take many)."""
    step = step_size(opts.model)
    return dataclasses.replace(
        opts, **{f: getattr(opts, f) or getattr(step, f) for f in dataclasses.asdict(step)}
    )


def _nodes(opts: DemoOptions) -> list[str]:
    return ["trainer", "validator", *[f"miner{i + 1}" for i in range(opts.miners)]]


def prepare(opts: DemoOptions, root: Path, s3_endpoint: str) -> dict[str, Any]:
    """Keys, base model and genesis under ``root`` (reused when they exist, so a demo can resume).

    An empty ``s3_endpoint`` makes a network without an S3 location (peer to peer only)."""
    opts = sized(opts)
    ids = {n: load_or_create_identity(root / n / "node.key") for n in _nodes(opts)}
    plan_file = root / "demo.json"
    if plan_file.exists():
        plan = json.loads(plan_file.read_text())
        if set(plan["nodes"]) != set(_nodes(opts)):
            raise ValueError(f"{root} holds a demo with nodes {sorted(plan['nodes'])}; use another --dir")
    else:
        plan = {"nodes": {n: {"status_port": free_port()} for n in _nodes(opts)}, "trainer_port": free_port()}
    trainer_addr = f"/ip4/127.0.0.1/tcp/{plan['trainer_port']}/p2p/{peer_id_for(ids['trainer'])}"
    genesis_path = root / "genesis.json"
    model_cache = opts.model_cache or _default_cache()
    if opts.model is not None:  # torch: only a --model demo derives its settings before the nodes start
        from p2prl.rl import run_defaults

        d = run_defaults(opts.model, opts.task, opts.task_params, opts.prompt_format, opts.max_new_tokens)
        fmt, max_new, params = d.prompt_format, d.max_new_tokens, d.task_params
    else:
        fmt, max_new, params = opts.prompt_format or "raw", opts.max_new_tokens or 4, dict(opts.task_params)
    spec = NetworkSpec(
        network_id=NETWORK_ID,
        validators=[ids["validator"].public_hex],
        bootstrap=[trainer_addr],
        anchor_interval=opts.anchor_interval,
        chunk_size=opts.chunk_size,
        max_staleness=opts.max_staleness,
        max_new_tokens=max_new,
        group_size=opts.group_size,
        groups_per_batch=opts.groups_per_batch,
        model=opts.model,
        task=opts.task,
        task_params=params,
        prompt_format=fmt,
        system_prompt=opts.system_prompt,
    )
    s3 = {"endpoint": s3_endpoint, "bucket": BUCKET, "prefix": ""} if s3_endpoint else None
    if not genesis_path.exists():
        # a resumed demo keeps its genesis; its nodes get the new local S3 endpoint by --s3-endpoint
        # an unknown task or bad parameters fail here; a data-backed task's file hash is pinned
        spec = dataclasses.replace(spec, task_params=pin_task_params(spec.task, spec.task_params))
        model, stops, assets = describe_model(spec, model_cache)
        sg = genesis_from_spec(spec, ids["trainer"], model, s3=s3, stop_token_ids=stops, assets=assets)
        write_genesis(sg, genesis_path)
    plan_file.write_text(json.dumps(plan, indent=1))
    plan["genesis"] = genesis_path
    plan["model_cache"] = model_cache
    plan["keys"] = {n: i.public_hex for n, i in ids.items()}
    plan["dishonest"] = ["miner2"] if opts.dishonest_miner else []
    return plan


def _node_args(opts: DemoOptions, root: Path, plan: dict[str, Any], name: str, s3_endpoint: str) -> list[str]:
    opts = sized(opts)
    role = "miner" if name.startswith("miner") else name
    listen = f"/ip4/127.0.0.1/tcp/{plan['trainer_port'] if role == 'trainer' else 0}"
    args = [
        "--log-level",
        "INFO",
        # the cheater is a benchmark's adversary, not a node setting
        *(["bench", "dishonest-miner"] if opts.dishonest_miner and name == "miner2" else ["node"]),
        "--role",
        role,
        "--network",
        str(plan["genesis"]),
        "--data-dir",
        str(root / name),
        "--listen",
        listen,
        "--status-port",
        str(plan["nodes"][name]["status_port"]),
        "--model-cache",
        str(plan["model_cache"]),
        "--torch-threads",
        str(opts.torch_threads),
        *(["--s3-endpoint", s3_endpoint] if s3_endpoint else ["--no-s3-enable"]),
        "--heartbeat-s",
        "2",
        "--local-network",  # every node is on 127.0.0.1: dial loopback addresses
        "--report-weights-sha256",  # the summary compares every node's weights
    ]
    if role == "trainer":
        lr = opts.lr or 3e-4
        if not opts.lr and opts.model is not None:
            from p2prl.rl import MODEL_LR  # torch, as --model's prepare() already loaded

            lr = MODEL_LR
        args += ["--lr", str(lr), "--train-batch-groups", str(opts.train_batch_groups)]
        args += ["--s3-sign"]  # it writes the mirror; the others read it unsigned
        args += ["--checkpoint-every", str(opts.checkpoint_every), "--train-epochs", str(opts.train_epochs)]
        args += ["--min-publish-s", str(opts.min_publish_s)]
    if role == "miner":
        args += ["--batches-per-version", str(opts.batches_per_version), "--engine", opts.engine]
        if opts.engine == "vllm":
            args += ["--vllm-check-weights"]  # the summary shows the engine's own weights hash
            if not opts.device.startswith("cuda"):
                args += ["--vllm-eager"]  # on a CPU compiling buys nothing but a slower start
    device = opts.validator_device or opts.device if role == "validator" else opts.device
    if role == "validator" and device != opts.device:
        # a validator on another device than the miners keeps the cross-engine defaults: calibrated
        # to its own drift, it rejected one honest batch of CUDA miners in six demos (their
        # fingerprints reach 0.005 as training runs); it cannot mine that device's reference batches
        args += ["--no-calibrate-tolerances"]
    elif role == "validator" and opts.engine == "vllm":
        # vLLM miners on this device: calibrated on reference batches vLLM mines, not its own
        # engine's (whose margin fell inside vLLM's tail: one honest batch in three demos failed)
        args += ["--reference-engine", "vllm"]
    args += ["--device", device] + (["--model", str(opts.model)] if opts.model else [])
    args += list(opts.node_args)
    return args


def _url(plan: dict[str, Any], name: str) -> str:
    return f"http://127.0.0.1:{plan['nodes'][name]['status_port']}"


def _statuses(plan: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {}
    for n in names:
        try:
            out[n] = fetch_status(_url(plan, n), timeout=2.0)
        except (OSError, ValueError):
            out[n] = None
    return out


def wait_up(
    sup: Supervisor,
    statuses: Callable[[], dict[str, dict[str, Any] | None]],
    timeout: float,
    stop: threading.Event,
) -> None:
    """Until every node answers ``statuses``; a node that exits or a timeout raises (with its log)."""
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        st = statuses()
        if all(s is not None for s in st.values()):
            return
        for c in sup.children:
            if not c.alive:
                raise RuntimeError(f"{c.name} exited with {c.proc.returncode}:\n{c.tail()}")
        if time.monotonic() > deadline:
            missing = [n for n, s in st.items() if s is None]
            raise RuntimeError(f"nodes not up after {timeout:.0f} s: {missing}")
        stop.wait(1.0)


def progress_line(elapsed: float, statuses: dict[str, dict[str, Any] | None], names: list[str]) -> str:
    """One line of a headless run: versions, how many miners are in sync, verdicts, recent reward."""
    trainer = statuses.get("trainer") or {}
    tv = int(trainer.get("version", 0))
    miners = [statuses.get(n) for n in names if n.startswith("miner")]
    versions = ",".join(str(m.get("version", "?")) if m else "?" for m in miners)
    in_sync = sum(1 for m in miners if m and int(m.get("version", -1)) == tv)
    # one version behind is the normal state while a new patch spreads: say so rather than "0/2"
    near = sum(1 for m in miners if m and 0 < tv - int(m.get("version", -1)) <= 1)
    sync = f"{in_sync}/{len(miners)} in sync" + (f", {near} one version behind" if near else "")
    c = (statuses.get("validator") or {}).get("counters", {})
    series = reward_series([trainer]) if trainer else []
    recent = mean_reward(series[-3:])
    reward = f"{recent:.3f} (v{series[-1][0]})" if recent is not None else "-"
    published = int(trainer.get("counters", {}).get("versions_published", 0))
    return (
        f"[{elapsed:5.0f} s] trainer v{tv} ({published} published) | miners v{versions}, "
        f"{sync} | groups accepted {int(c.get('groups_accepted', 0))} "
        f"rejected {int(c.get('groups_rejected', 0))} | reward {reward}"
    )


# rejections that say when a batch arrived, not what it holds: the validator was behind (stale), could
# not fetch the batch within its probe (unreachable: on one loaded machine, the validator's own
# process starved as often as the miner's), or the batch follows one it never judged (index_gap).
# Their count follows the machine's load; the summary reports it as a figure, the check ignores it.
TIMING_REJECTIONS = frozenset({VerdictReason.STALE, VerdictReason.UNREACHABLE, VerdictReason.INDEX_GAP})


def honest_check(miners: list[dict[str, Any]], rejections: dict[str, int]) -> dict[str, Any]:
    """An honest network rejects nothing for what its rollouts hold and scores every honest miner
    above 0 (with a dishonest miner in the run, its rejections are expected and not judged here).
    Timing rejections (``TIMING_REJECTIONS``) are counted in the detail, not failed on."""
    honest = [m for m in miners if m.get("honest", True)]
    zero = [m["name"] for m in honest if int(m.get("score", 0)) <= 0]
    if len(honest) == len(miners):
        other = {k: v for k, v in rejections.items() if k not in TIMING_REJECTIONS}
        timing = {k: v for k, v in rejections.items() if k in TIMING_REJECTIONS}
    else:  # the validator's counters do not say whose: judge honest miners by the verdicts they got
        mine = [(m["name"], k, v) for m in honest for k, v in m.get("rejections", {}).items()]
        other = {f"{n} {k}": v for n, k, v in mine if k not in TIMING_REJECTIONS}
        timing = {f"{n} {k}": v for n, k, v in mine if k in TIMING_REJECTIONS}
    ok = not zero and not other
    late = ", ".join(f"{k} {int(v)}" for k, v in sorted(timing.items()))
    detail = "honest miners: nothing rejected for its content" + (f" (timing: {late})" if late else "")
    detail += ", every score > 0"
    if not ok:
        detail = f"honest miners: rejected {other or 'nothing'}, score 0: {zero or 'none'}"
    return {"ok": ok, "detail": detail}


def why_no_training(trainer: dict[str, Any], validator: dict[str, Any]) -> str:
    """Why a run published nothing new, when it did not ("" when it trained): a silent 0 → 0 is the
    worst answer a user can get to "is it learning?"."""
    tc = trainer.get("counters", {})
    steps, skipped = int(tc.get("train_steps", 0)), int(tc.get("train_steps_skipped", 0))
    if steps and skipped == steps:
        return (
            f"the trainer skipped all {steps} steps: every group's rewards were equal (no GRPO signal); "
            "a task with partial credit or more samples per prompt gives it one"
        )
    if not steps and int(trainer.get("counters", {}).get("versions_published", 0)) <= 1:
        accepted = int(validator.get("counters", {}).get("groups_accepted", 0))
        if not accepted:
            return "the trainer took no step: the validator accepted no group yet (see rejections)"
        if trainer.get("stepping"):
            return (
                f"the trainer's first step was still running at the end ({accepted} groups accepted): "
                "a step on this model and machine takes longer than the run left it; run longer"
            )
        held, batch = int(trainer.get("buffer_groups", 0)), int(trainer.get("train_batch_groups", 0))
        return (
            f"the trainer took no step: {accepted} groups accepted, {held} in its buffer, "
            f"fewer than one training batch ({batch} groups)"
        )
    return ""


def summarize(
    plan: dict[str, Any], statuses: dict[str, dict[str, Any] | None], names: list[str]
) -> dict[str, Any]:
    """The run summary from every node's final status (see docs/NODE.md)."""
    trainer = statuses.get("trainer") or {}
    validator = statuses.get("validator") or {}
    miners = []
    for n in names:
        if not n.startswith("miner"):
            continue
        s = statuses.get(n) or {}
        v = int(s.get("version", -1)) if s else -1
        miners.append(
            {
                "name": n,
                "key": plan["keys"][n],
                "version": v,
                "weights_hash": s.get("weights_hash", ""),
                "weights_sha256": s.get("weights_sha256", ""),
                "engine": s.get("engine", ""),
                # vLLM: the hash of the weights read back out of the engine (--vllm-check-weights)
                "engine_weights_hash": s.get("engine_weights_hash", ""),
                "engine_weights_checked": int(s.get("counters", {}).get("engine_weights_checked", 0)),
                "engine_weights_mismatch": int(s.get("counters", {}).get("engine_weights_mismatch", 0)),
                "rollouts_produced": int(s.get("counters", {}).get("rollouts_produced", 0)),
                "groups_accepted": int(s.get("counters", {}).get("groups_accepted", 0)),
                "groups_rejected": int(s.get("counters", {}).get("groups_rejected", 0)),
                "score": int(validator.get("scores", {}).get(plan["keys"][n], 0)),
                "honest": n not in plan.get("dishonest", []),
                "rejections": dict(s.get("labelled", {}).get("rejected", {})),
                "bytes_from_peers": int(s.get("gauges", {}).get("net_bytes_down", 0)),
                "bytes_from_s3": int(s.get("gauges", {}).get("net_bytes_s3", 0)),
            }
        )
    versions = sorted({m["version"] for m in miners})
    sha = trainer.get("sha256_by_version", {})
    hashes = trainer.get("hashes", {})
    at = versions[0] if len(versions) == 1 else None
    series = reward_series([trainer]) if trainer else []
    reward_first, reward_last = reward_ends(series)
    c = validator.get("counters", {})
    published = int(trainer.get("counters", {}).get("patch_bytes_total", 0))
    uploaded = int(trainer.get("gauges", {}).get("net_bytes_up", 0))
    return {
        "versions_published": int(trainer.get("counters", {}).get("versions_published", 0)),
        "trainer_version": int(trainer.get("version", 0)),
        "miners": miners,
        "trainer_weights_sha256": sha.get(str(at), "") if at is not None else "",
        "trainer_weights_hash": hashes.get(str(at), "") if at is not None else "",
        "miners_version": at,
        "rollouts_accepted": int(c.get("rollouts_accepted", 0)),
        "rollouts_rejected": int(c.get("rollouts_rejected", 0)),
        "groups_accepted": int(c.get("groups_accepted", 0)),
        "groups_rejected": int(c.get("groups_rejected", 0)),
        "groups_trained_on": int(trainer.get("counters", {}).get("groups_consumed", 0)),
        "train_steps": int(trainer.get("counters", {}).get("train_steps", 0)),
        "train_steps_skipped": int(trainer.get("counters", {}).get("train_steps_skipped", 0)),
        "notice": why_no_training(trainer, validator),
        "trainer_patch_bytes": published,
        "trainer_upload_bytes": uploaded,
        "trainer_upload_ratio": round(uploaded / published, 3) if published else 0.0,
        "rejections": validator.get("labelled", {}).get("rejected", {}),
        "checks": {"honest": honest_check(miners, validator.get("labelled", {}).get("rejected", {}))},
        # the validator's tolerances and the largest errors it measured (rejected batches included)
        "proof": {k[6:]: v for k, v in validator.get("gauges", {}).items() if k.startswith("proof_")},
        "reward_first": reward_first,
        "reward_last": reward_last,
        "reward_by_version": {str(v): round(m, 4) for v, m, _ in series},
        "scores": validator.get("scores", {}),
        # per version: reward, rollouts trained on / produced / accepted, acceptance (the --reward-csv rows)
        "by_version": per_version(
            trainer, validator, [statuses.get(n) for n in names if n.startswith("miner")]
        ),
    }


def run_demo(opts: DemoOptions) -> dict[str, Any] | None:
    """Run the demo; returns the summary when it ran with a duration (None after an interactive run)."""
    tmp = None
    root = opts.workdir
    if root is None:
        tmp = Path(tempfile.mkdtemp(prefix="p2prl-demo-"))
        root = tmp
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = _nodes(opts)
    stop = threading.Event()
    # a closed terminal (SIGHUP) or a kill (SIGTERM) stops the network like Ctrl-C: no orphaned nodes
    stop_signals = (signal.SIGTERM, signal.SIGHUP)
    prev = {sig: signal.getsignal(sig) for sig in stop_signals}
    for sig in stop_signals:
        signal.signal(sig, lambda *_: stop.set())
    summary: dict[str, Any] | None = None
    closing: dict[str, Any] | None = None  # an interactive run's last state, printed once stopped
    plan: dict[str, Any] | None = None
    sup = Supervisor(root)
    try:
        missing = s3_missing()
        if missing is None:
            s3 = sup.start_s3()
            s3.create_bucket(BUCKET)
            endpoint, where = s3.endpoint, f"local S3 at {s3.endpoint}"
        else:
            endpoint, where = "", "no S3"
            print(
                f"notice: the local S3 endpoint cannot start ({missing}); the demo runs peer to peer "
                "only, without the S3 mirror/fallback. For it: pip install 'moto[s3]>=5.0' flask flask-cors",
                flush=True,
            )
        model = f"model {opts.model}" if opts.model is not None else "building the base model if needed"
        print(f"demo directory {root}; {where}; {model}…", flush=True)
        plan = prepare(opts, root, endpoint)
        for n in names:
            sup.spawn(n, _node_args(opts, root, plan, n, endpoint), env=S3_ENV)
        urls = [_url(plan, n) for n in names]
        print("nodes: " + ", ".join(f"{n} {u}" for n, u in zip(names, urls, strict=True)), flush=True)
        wait_up(sup, lambda: _statuses(plan, names), opts.startup_timeout_s, stop)
        if opts.duration is None and opts.dashboard:
            run_dashboard(urls, stop=stop)  # Ctrl-C sets stop (dashboard.live), then it returns
            closing = _closing(plan, names, len(sup.children))
        else:
            start = time.monotonic()
            end = start + (opts.duration if opts.duration is not None else 1e12)
            next_line = start + opts.progress_s
            while not stop.is_set() and time.monotonic() < end:
                for c in sup.children:
                    if not c.alive:
                        raise RuntimeError(f"{c.name} exited with {c.proc.returncode}:\n{c.tail()}")
                if time.monotonic() >= next_line:
                    now = time.monotonic()
                    print(progress_line(now - start, _statuses(plan, names), names), flush=True)
                    next_line = now + opts.progress_s
                stop.wait(1.0)
        if opts.duration is not None:
            summary = _finish(sup, plan, names, opts, stop)
            summary["held_out"] = {}
    except KeyboardInterrupt:
        closing = _closing(plan, names, len(sup.children)) if plan is not None else None
    except (RuntimeError, ValueError, OSError) as e:
        log.error("demo failed: %s", e)
        summary = {"error": str(e)}
    finally:
        t0 = time.monotonic()
        prev_int = signal.signal(signal.SIGINT, lambda *_: print("still stopping…", flush=True))
        try:
            codes = sup.stop_all()
        finally:
            signal.signal(signal.SIGINT, prev_int)
        if closing is not None:
            print(f"stopped in {time.monotonic() - t0:.1f} s; the network at Ctrl-C:", flush=True)
            print("\n".join(run_report(closing)), flush=True)
        for sig, handler in prev.items():
            signal.signal(sig, handler)
        if summary is not None and "error" not in summary:
            summary["exit_codes"] = codes
            if "held_out" in summary and not stop.is_set():
                summary["held_out"] = _held_out(opts, root, plan)
        if opts.summary_json is not None and summary is not None:
            Path(opts.summary_json).write_text(json.dumps(summary, indent=1) + "\n")
        if tmp is not None and not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            print(f"kept {tmp}", flush=True)
    return summary


def _held_out(opts: DemoOptions, root: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The held-out accuracy of the base model and of the version miner1 ended on (nodes stopped)."""
    n = opts.eval_problems if opts.eval_problems >= 0 else (256 if opts.model is None else 32)
    if n == 0:
        return {}
    from p2prl.demo.heldout import held_out

    print(f"held-out evaluation: {n} problems, base model and last version…", flush=True)
    try:
        return held_out(plan["genesis"], opts.model, plan["model_cache"], root / "miner1" / "miner" / "weights", n)
    except (OSError, ValueError) as e:
        log.warning("held-out evaluation failed: %s", e)
        return {"error": str(e)}


def _closing(plan: dict[str, Any], names: list[str], nodes: int) -> dict[str, Any] | None:
    """Ctrl-C on an interactive run: say at once that the network is stopping (each node saves its
    state, up to the supervisor's grace period), and read the summary it ends with before it stops."""
    print(f"\nstopping {nodes} nodes (each saves its state; up to 20 s)…", flush=True)
    try:
        st = _statuses(plan, names)
        s = summarize(plan, st, names)
    except KeyboardInterrupt:  # a second Ctrl-C: stop without the summary
        return None
    # read while the trainer still publishes: a miner one version behind is fetching the newest patch
    s["while_publishing"] = not (st.get("trainer") or {}).get("paused", False)
    return s


def settled(statuses: dict[str, dict[str, Any] | None], miners: list[str]) -> tuple[Any, ...] | None:
    """What must stop moving before the summary is read (None while the network is still catching up).

    The trainer paused, the validator and every miner on its version, the validator's queue empty: the
    returned tuple then holds every miner's production and verdict tallies, and the network has
    settled once two polls in a row return the same tuple. Reading it earlier scored a miner by
    batches the validator had not judged yet: an honest miner whose last batches were still queued
    when its version moved on ended a loaded run at score 0.
    """
    t = statuses.get("trainer") or {}
    v = statuses.get("validator") or {}
    tv = int(t.get("version", -1))
    if not t.get("paused") or int(v.get("version", -2)) != tv:
        return None
    gauges = v.get("gauges", {})
    if int(gauges.get("judge_backlog", 0)) or int(gauges.get("judge_in_hand", 0)):
        return None
    tallies: list[Any] = [tv]
    for m in miners:
        s = statuses.get(m) or {}
        if s.get("version") != tv:
            return None
        c = s.get("counters", {})
        tallies.append((c.get("batches_announced", 0), c.get("groups_accepted", 0), c.get("groups_rejected", 0)))
    return tuple(tallies)


def _finish(
    sup: Supervisor, plan: dict[str, Any], names: list[str], opts: DemoOptions, stop: threading.Event
) -> dict[str, Any]:
    """Quiesce the trainer, let the miners catch up to its last version and the validator judge what
    they announced there (``settled``), then read the summary."""
    sup.signal("trainer", signal.SIGUSR1)
    miners = [n for n in names if n.startswith("miner")]
    deadline = time.monotonic() + opts.catch_up_s
    statuses = _statuses(plan, names)
    last: tuple[Any, ...] | None = None
    while time.monotonic() < deadline and not stop.is_set():
        statuses = _statuses(plan, names)
        now = settled(statuses, miners)
        if now is not None and now == last:
            break
        last = now
        stop.wait(1.0)
    return summarize(plan, statuses, names)
