"""``p2prl train-local``: the whole learning loop in one process, with a live view or one JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def _reward_line(rewards: list[float], width: int = 60) -> str:
    """The whole run's rewards (in [0, 1]) as bucket means, one chart character each."""
    from p2prl.dashboard import sparkline

    step = max(1, len(rewards) // width)
    pts = [sum(rewards[i : i + step]) / len(rewards[i : i + step]) for i in range(0, len(rewards), step)]
    return sparkline(pts, width, lo=0.0, hi=1.0)


def train_local(
    minutes: float = typer.Option(5.0, "--minutes", help="Wall-clock budget."),
    steps: int = typer.Option(0, "--steps", help="Stop after this many steps (0: no limit)."),
    json_out: bool = typer.Option(False, "--json", help="Headless: print one JSON summary object."),
    lr: float = typer.Option(
        None, "--lr", help="Learning rate (default: 3e-4; 4e-5 with --model, p2prl.rl.gendefaults)."
    ),
    seed: int = typer.Option(0, "--seed", help="Run seed (prompts and sampling)."),
    prompts: int = typer.Option(32, "--prompts", help="Prompts (groups) per step."),
    samples: int = typer.Option(8, "--samples", help="Completions per prompt."),
    eval_every: int = typer.Option(
        0, "--eval-every", help="Greedy evaluation every N steps (0: start and end)."
    ),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="Where the default model is built/cached."),
    history: bool = typer.Option(False, "--history", help="With --json: include per-step records."),
    resume: Path = typer.Option(
        None, "--resume", help="Start from this checkpoint (masters, optimizer, version)."
    ),
    save: Path = typer.Option(
        None, "--save", help="Checkpoint here at the end (a directory under torchrun)."
    ),
    model: Path | None = typer.Option(
        None, "--model", help="Local Hugging Face causal-LM directory (default: the built-in tiny model)."
    ),
    task: str = typer.Option("addition", "--task", help="Task name (the built-in model knows addition)."),
    task_param: list[str] = typer.Option(
        [], "--task-param", help="Task parameter KEY=VALUE (default: the model's, see docs/RL.md)."
    ),
    prompt_format: str | None = typer.Option(
        None, "--prompt-format", help="raw or chat (default: chat when the tokenizer has a template)."
    ),
    system_prompt: str = typer.Option("", "--system-prompt", help="System prompt for the chat format."),
    max_new_tokens: int = typer.Option(
        0, "--max-new-tokens", help="Completion bound (0: the model's default, docs/RL.md)."
    ),
    eval_problems: int = typer.Option(
        0, "--eval-problems", help="Held-out problems for the greedy evaluation (0: 256, 64 for --model)."
    ),
    device: str = typer.Option("cpu", "--device", help="Torch device: auto, cpu, cuda or cuda:N."),
    engine: str = typer.Option(
        "auto", "--engine", help="Rollout engine: auto (vLLM where installed, on CUDA), hf or vllm."
    ),
    threads: int = typer.Option(
        0, "--threads", help="Torch CPU threads (0: $P2PRL_TORCH_THREADS or 1, fastest for the tiny model)."
    ),
) -> None:
    """Run generation, reward, replay buffer and GRPO in one process."""
    from p2prl.rl import (
        DEFAULT_LR,
        MODEL_LR,
        LocalConfig,
        ModelDirError,
        default_cache_dir,
        parse_task_params,
        run_defaults,
    )
    from p2prl.rl import train_local as run

    try:
        d = run_defaults(model, task, parse_task_params(task_param), prompt_format, max_new_tokens)
    except (ModelDirError, ValueError) as e:  # not a causal LM, chat without a template: one line
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    cfg = LocalConfig(
        minutes=minutes,
        max_steps=steps or None,
        lr=lr if lr is not None else (DEFAULT_LR if model is None else MODEL_LR),
        seed=seed,
        prompts_per_step=prompts,
        samples_per_prompt=samples,
        eval_every=eval_every,
        cache_dir=cache_dir or default_cache_dir(),
        threads=threads,
        resume=resume,
        save=save,
        model_dir=model,
        task=task,
        task_params=d.task_params,
        prompt_format=d.prompt_format,
        max_new_tokens=d.max_new_tokens,
        eval_problems=eval_problems or (256 if model is None else 64),
        system_prompt=system_prompt,
        device=device,
        engine=engine,
    )
    from p2prl.rl import launched, rank

    if launched() and rank() != 0:  # a follower rank under torchrun: rank 0 reports
        run(cfg)
        return
    from p2prl.rl import EngineChoiceError

    try:
        if json_out:
            summary = run(cfg)
            assert summary is not None
            if not history:
                summary.pop("history")
            typer.echo(json.dumps(summary, sort_keys=True))
            return
        _live(cfg, run)
    except EngineChoiceError as e:  # --engine vllm where vLLM cannot run the model: one line
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


def _live(cfg: Any, run: Any) -> None:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    rewards: list[float] = []
    last: dict[str, Any] = {}

    def render() -> Group:
        t = Table(title="p2prl train-local", show_header=False)
        t.add_row("step", str(last.get("step", 0)))
        t.add_row("elapsed", f"{last.get('elapsed_s', 0.0):.0f} s / {cfg.minutes * 60:.0f} s")
        t.add_row("reward (this version)", f"{last.get('reward', 0.0):.3f}")
        if rewards:
            k = rewards[-20:]
            t.add_row("reward (last 20 steps)", f"{sum(k) / len(k):.3f}")
        if "greedy" in last:
            t.add_row("greedy success", f"{last['greedy']:.3f}")
        t.add_row("bf16 changed fraction", f"{last.get('changed_fraction', 0.0):.4f}")
        if last.get("skipped"):
            t.add_row("notice", "step skipped: every group's rewards were equal (no GRPO signal)")
        t.add_row(
            "clip fraction / grad norm",
            f"{last.get('clip_frac', 0.0):.3f} / {last.get('grad_norm', 0.0):.3f}",
        )
        return Group(t, Text("reward over time  " + _reward_line(rewards)))

    console = Console()
    console.print("building/loading the default model…" if cfg.model_dir is None else f"loading {cfg.model_dir}…")
    with Live(render(), console=console, refresh_per_second=4) as live:

        def on_step(rec: dict[str, Any]) -> None:
            rewards.append(rec["reward"])
            last.update(rec)
            live.update(render())

        summary = run(cfg, on_step=on_step)
    console.line()
    console.print(
        f"reward {summary['reward_first']:.3f} → {summary['reward_last_10pct']:.3f} (last 10% of steps); "
        f"greedy {summary['greedy_first']:.3f} → {summary['greedy_last']:.3f}; {summary['steps']} steps; "
        f"changed fraction mean {summary['changed_fraction_mean']:.4f}"
    )
    if summary.get("notice"):
        console.print(f"notice: {summary['notice']}")
