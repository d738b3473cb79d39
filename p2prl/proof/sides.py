"""Which side a miner took where its token is not the validator's pick, and whether that paid.

Where a public uniform lies within the sampling margin of an interval's edge, honest rounding takes
either neighbour, blind to what the rest of the rollout earns; a miner steering those choices takes the
one that pays. The sampling check's rungs bound how many such choices a batch may hold, but each can be
worth a whole reward (a short answer's first digit). So at positions of a recomputed rollout whose
uniform lies outside the chosen token's interval under the validator's distribution, the validator
continues the rollout from that position with its own model and the same uniforms and compares the
rewards: the miner's side *won* where its rollout earns more, *lost* where less (most positions tie).
Honest rounding wins as often as it loses; a key's record over its recent batches is tested as a
one-sided sign test (``SideRecord``), so steering that stays inside every per-batch count shows as a
run of wins, and its net gain is bounded by the square root of the decided positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from p2prl.lru import LRU
from p2prl.protocol import is_hex
from p2prl.rl import binom_log_sf


class Off(NamedTuple):
    """A recomputed position whose token is not the validator's pick."""

    group: int
    rollout: int
    position: int
    distance: float  # how far the uniform lies outside the chosen token's interval (> 0)


@dataclass(frozen=True)
class Side:
    """One position to judge: the rollout up to it, its uniforms from it on, what the rollout earned."""

    prompt_ids: list[int]
    prefix: list[int]  # the completion before the position
    uniforms: np.ndarray  # the rollout's public uniforms from the position on
    problem: Any
    reward: float  # the miner's rollout's (checked against the task already)


def off_positions(d: np.ndarray) -> np.ndarray:
    """Positions whose uniform lies outside the chosen token's interval (``d`` > 0): where the miner's
    token is not the validator's pick."""
    return np.flatnonzero(np.asarray(d) > 0)


def judge_sides(
    model: Any, tokenizer: Any, task: Any, sides: Sequence[Side], max_new_tokens: int, temperature: float, top_p: float
) -> list[int]:
    """Per side, +1 where the miner's rollout earns more than the validator's continuation from the
    position with the same uniforms, -1 where less, 0 where the same. One batched generation."""
    from p2prl.rl import GenerationParams, HFEngine

    if not sides:
        return []
    steps = max(max_new_tokens - len(s.prefix) for s in sides)
    us = np.full((len(sides), steps), 0.5, dtype=np.asarray(sides[0].uniforms).dtype)
    for k, s in enumerate(sides):
        u = np.asarray(s.uniforms)[:steps]
        us[k, : len(u)] = u
    params = GenerationParams(max_new_tokens=steps, temperature=temperature, top_p=top_p)
    rows = [list(s.prompt_ids) + list(s.prefix) for s in sides]
    out = HFEngine(model, tokenizer, return_hidden=False).generate_rows(rows, us, params)
    signs = []
    for s, sample in zip(sides, out, strict=True):
        ids = list(s.prefix) + sample.completion_ids[: max_new_tokens - len(s.prefix)]
        theirs = task.reward(s.problem, tokenizer.decode(ids))
        signs.append(int(s.reward > theirs) - int(s.reward < theirs))
    return signs


class SideRecord:
    """Per key, the sides it won and lost over about its last ``window`` decided positions (both
    halved when their sum passes it: old batches weigh less, and a key costs two numbers), in an LRU of
    ``capacity`` keys. A key dropped from it starts again from nothing, as a new key does."""

    def __init__(self, window: int, capacity: int) -> None:
        if window < 2:
            raise ValueError("window must be >= 2")
        self.window = window
        self._d: LRU[bytes, tuple[float, float]] = LRU(capacity)

    def add(self, key: bytes, won: int, lost: int) -> float:
        """Fold one batch's decided sides in; returns the key's log p-value (``log_sf``)."""
        w, l_ = self._d.get(key, (0.0, 0.0))
        self._d.put(key, self._fit(w + won, l_ + lost))
        return self.log_sf(key)

    def _fit(self, w: float, l_: float) -> tuple[float, float]:
        """Both counts halved until their sum is within the window."""
        while w + l_ > self.window:
            w, l_ = w / 2, l_ / 2
        return w, l_

    def get(self, key: bytes) -> tuple[float, float]:
        return self._d.get(key, (0.0, 0.0))

    def state(self) -> dict[str, Any]:
        """What a validator keeps across a restart (JSON-able; keys least recently judged first)."""
        return {"window": self.window, "keys": [[k.hex(), w, l_] for k, (w, l_) in self._d.items()]}

    def restore(self, state: Any) -> int:
        """Take back ``state()`` of an earlier run (entries not well formed are skipped; counts are
        halved into this record's window); returns the keys taken back."""
        if not isinstance(state, dict) or not isinstance(state.get("keys"), list):
            return 0
        n = 0
        for entry in state["keys"][-self._d.capacity :]:
            if not (isinstance(entry, list) and len(entry) == 3 and is_hex(entry[0], 32)):
                continue
            key, w, l_ = entry
            if not all(type(x) in (int, float) and math.isfinite(x) and x >= 0 for x in (w, l_)):
                continue
            self._d.put(bytes.fromhex(key), self._fit(float(w), float(l_)))
            n += 1
        return n

    def __len__(self) -> int:
        return len(self._d)

    def log_sf(self, key: bytes) -> float:
        """log P(at least this many wins) were wins and losses even odds: the wins rounded down and the
        losses up, so halving never makes a record look worse than it was."""
        w, l_ = self.get(key)
        won, lost = math.floor(w), math.ceil(l_)
        return binom_log_sf(won, won + lost, 0.5)
