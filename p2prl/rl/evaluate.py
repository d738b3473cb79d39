"""Held-out evaluation: greedy accuracy of a policy on a fixed problem set no trainer samples from.

The problems come from :func:`eval_seeds` (``sha256("p2prl-eval:i")``), a set disjoint in practice
from the seeds a network or ``train-local`` draws (``derive_seed`` of a version, a miner key and an
index), so the figure measures what the model learned, not what it saw. Greedy decoding takes the
sampling noise out; "accuracy" counts ``Task.correct`` (full credit), not shaped partial rewards.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from p2prl.rl.engine import GenerationParams, HFEngine
from p2prl.rl.tasks import Task
from p2prl.rl.tokenizer import Tokenizer

EVAL_PROBLEMS = 128


def eval_seeds(n: int, salt: str = "eval") -> list[bytes]:
    """Fixed problem seeds for evaluation, disjoint in practice from training seeds."""
    return [hashlib.sha256(f"p2prl-{salt}:{i}".encode()).digest() for i in range(n)]


def evaluate(
    model: Any, tokenizer: Tokenizer, task: Task, n: int = 256, max_new_tokens: int = 8, salt: str = "eval"
) -> dict[str, Any]:
    """Greedy on ``n`` fixed problems: accuracy (fraction correct), mean reward, and a few samples."""
    problems = [task.problem(s) for s in eval_seeds(n, salt)]
    engine = HFEngine(model, tokenizer, return_hidden=False)
    out = engine.generate(
        [tokenizer.encode_prompt(p.prompt) for p in problems],
        1,
        GenerationParams(max_new_tokens, temperature=0.0),
    )
    texts = [tokenizer.decode(g[0].completion_ids) for g in out]
    correct = sum(task.correct(p, t) for p, t in zip(problems, texts, strict=True))
    reward = sum(task.reward(p, t) for p, t in zip(problems, texts, strict=True))
    return {
        "accuracy": correct / n,
        "correct": correct,
        "problems": n,
        "reward": reward / n,
        "examples": [
            {"prompt": p.prompt, "completion": t} for p, t in list(zip(problems, texts, strict=True))[:3]
        ],
    }


def greedy_success(
    model: Any, tokenizer: Tokenizer, task: Task, n: int = 256, max_new_tokens: int = 8, salt: str = "eval"
) -> float:
    """Fraction of ``n`` fixed problems the model answers correctly with greedy decoding."""
    return float(evaluate(model, tokenizer, task, n, max_new_tokens, salt)["accuracy"])


def evaluate_dir(
    defaults: Any, model_cache: Path, system_prompt: str = "", n: int = EVAL_PROBLEMS
) -> dict[str, Any]:
    """``evaluate`` on a model directory (``defaults``: a :class:`~p2prl.rl.gendefaults.RunDefaults`;
    its ``model_dir`` None is the built-in model, built into ``model_cache`` if needed)."""
    import torch

    from p2prl.rl.model import build_default_model, load_model
    from p2prl.rl.modeldir import stop_ids_of
    from p2prl.rl.tasks import get_task
    from p2prl.rl.tokenizer import load_tokenizer

    d = defaults.model_dir or build_default_model(model_cache)
    task = get_task(defaults.task, **defaults.task_params)
    model, raw = load_model(d, dtype=torch.bfloat16)
    tok = load_tokenizer(d, defaults.prompt_format, system_prompt, stop_ids_of(d, raw.tok))
    res = evaluate(model, tok, task, n, defaults.max_new_tokens)
    return {
        **res,
        "model_dir": str(d),
        "task": defaults.task,
        "task_params": defaults.task_params,
        "prompt_format": defaults.prompt_format,
        "max_new_tokens": defaults.max_new_tokens,
    }
