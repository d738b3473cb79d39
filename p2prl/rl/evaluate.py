"""Greedy success rate of a policy on a task: the learning signal we report, free of sampling noise."""

from __future__ import annotations

import hashlib
from typing import Any

from p2prl.rl.engine import GenerationParams, HFEngine
from p2prl.rl.tasks import Task
from p2prl.rl.tokenizer import Tokenizer


def eval_seeds(n: int, salt: str = "eval") -> list[bytes]:
    """Fixed problem seeds for evaluation, disjoint in practice from training seeds."""
    return [hashlib.sha256(f"p2prl-{salt}:{i}".encode()).digest() for i in range(n)]


def greedy_success(
    model: Any, tokenizer: Tokenizer, task: Task, n: int = 256, max_new_tokens: int = 8, salt: str = "eval"
) -> float:
    """Fraction of ``n`` fixed problems the model answers exactly with greedy decoding."""
    problems = [task.problem(s) for s in eval_seeds(n, salt)]
    engine = HFEngine(model, tokenizer, return_hidden=False)
    out = engine.generate(
        [tokenizer.encode_prompt(p.prompt) for p in problems], 1, GenerationParams(max_new_tokens, temperature=0.0)
    )
    ok = sum(
        task.reward(p, tokenizer.decode(g[0].completion_ids)) for p, g in zip(problems, out, strict=True)
    )
    return ok / n
