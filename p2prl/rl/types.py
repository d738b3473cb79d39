"""Rollouts as the trainer consumes them: token ids, behaviour logprobs, reward, producing version."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2prl.rl.tasks import Problem


@dataclass
class Rollout:
    """One sampled completion; ``logprobs[i]`` is the behaviour logprob of ``completion_ids[i]``."""

    completion_ids: list[int]
    logprobs: list[float]
    reward: float

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError("completion_ids and logprobs differ in length")


@dataclass
class RolloutGroup:
    """Several completions of one prompt by policy ``version``; GRPO normalizes rewards within it."""

    prompt_ids: list[int]
    rollouts: list[Rollout]
    version: int
    miner: str = ""
    problem: Problem | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # whose public uniforms the rollouts followed (rl.sampling): the miner's prompt index and the
    # seed of its prompts and uniforms (the version's manifest hash, or a chained batch's seed);
    # -1 / "" for groups a local run made without them
    index: int = -1
    manifest_hash: str = ""

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def n_tokens(self) -> int:
        return sum(len(self.prompt_ids) + len(r.completion_ids) for r in self.rollouts)
