"""``p2prl bench trainer``: step time, publish time and memory per rank of the sharded learner.

Run it under ``torchrun --standalone --nproc-per-node N`` (N = 1, 2, …) to compare rank counts on
the ~24M-parameter configuration of the proof benchmark; rollouts are synthetic (random tokens,
rewards and behaviour logprobs), so only the cost of a GRPO step is measured.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from p2prl.patch import changed_fraction
from p2prl.rl import distributed
from p2prl.rl.grpo import GRPOConfig
from p2prl.rl.model import BIG_ARCH, random_qwen2
from p2prl.rl.tokenizer import CharTokenizer
from p2prl.rl.types import Rollout, RolloutGroup


def synthetic_groups(
    n_groups: int, group_size: int, tokens: int, vocab: int, seed: int
) -> list[RolloutGroup]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        prompt = [rng.randrange(2, vocab) for _ in range(8)]
        rewards = [1.0, 0.0] + [
            float(rng.random() < 0.5) for _ in range(group_size - 2)
        ]  # signal in every group
        rolls = [
            Rollout(
                [rng.randrange(2, vocab) for _ in range(tokens)],
                [-rng.uniform(0.5, 4.0) for _ in range(tokens)],
                r,
            )
            for r in rewards
        ]
        out.append(RolloutGroup(prompt, rolls, 0, "bench"))
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a
    )


def run(steps: int, groups: int, group_size: int, tokens: int, lr: float) -> dict[str, Any] | None:
    """Rank 0 returns the figures; the other ranks serve its learner and return None."""
    if distributed.launched() and distributed.rank() != 0:
        distributed.follow()
        return None
    vocab = CharTokenizer().vocab_size
    model = random_qwen2(BIG_ARCH, vocab, 0).float()
    params = sum(p.numel() for p in model.parameters())
    learner = distributed.make_learner(
        model, GRPOConfig(lr=lr), 0, publish_mode="gather"
    )  # modes timed one by one
    try:
        data = [synthetic_groups(groups, group_size, tokens, vocab, s) for s in range(steps + 1)]
        learner.step(data[0])  # warm-up: allocates the optimizer state
        times = []
        for d in data[1:]:
            t0 = time.perf_counter()
            learner.step(d)
            times.append(time.perf_counter() - t0)
        pub: dict[str, Any] = {}
        if isinstance(learner, distributed.Leader):
            base = learner.published_state("sparse")  # the sparse path's baseline
            learner.step(data[0])
            t0 = time.perf_counter()
            gathered = learner.published_state("gather")
            pub["publish_gather_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            sparse = learner.published_state("sparse")
            pub["publish_sparse_s"] = time.perf_counter() - t0
            pub["publish_identical"] = _same(gathered, sparse)
            pub["changed_fraction"] = changed_fraction(base, gathered)
            ranks = learner.memory()
        else:
            ranks = []
        return {
            "world_size": distributed.world_size(),
            "parameters": params,
            "rollouts_per_step": groups * group_size,
            "completion_tokens": tokens,
            "step_s": statistics.median(times),
            **pub,
            "ranks": ranks,
        }
    finally:
        close = getattr(learner, "close", None)
        if close is not None:
            close()
