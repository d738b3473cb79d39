"""How much work one version of a demo network holds, by model.

The trainer's step (groups, passes over them) and what each miner announces per version (batches of
groups) are sized together, so the trainer always has its next step's groups fresh (staleness stays
0-1), and so a version takes seconds, not minutes, on a 2-core CPU whatever the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepSize:
    train_batch_groups: int
    train_epochs: int
    groups_per_batch: int
    batches_per_version: int


# the built-in model: train-local's step (32 prompts x 8 samples) taken 3 times, each of two miners
# making 2 batches of 16 prompts — a 2-core machine publishes a version every second or so
TOY_STEP = StepSize(train_batch_groups=32, train_epochs=3, groups_per_batch=16, batches_per_version=2)
# a pretrained ~100M model: one pass over 8 prompts x 8 samples (on a quiet 2-core machine ~6 s of
# generation and ~23 s of GRPO step for SmolLM2-135M, docs/benchmarks/real-model.md), each of two
# miners making one batch of 4 prompts; the toy's step (256 completions, 3 passes) took no step in
# 7 minutes there
MODEL_STEP = StepSize(train_batch_groups=8, train_epochs=1, groups_per_batch=4, batches_per_version=1)


def step_size(model_dir: Path | None) -> StepSize:
    """The step for the built-in model (None) or a model directory."""
    return TOY_STEP if model_dir is None else MODEL_STEP
