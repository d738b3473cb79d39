"""Per-miner scores: valid unique rollouts over a sliding window of versions, zeroed by any hard failure.

A miner's score at version ``v`` is the number of unique rollouts the validator accepted from it for
versions ``v - window + 1 .. v``, or 0 while a hard failure (proof of cheating) lies in that window.
Memory is bounded: at most ``max_miners`` miners (the least recently active are forgotten first) and
one counter per version in the window each.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from p2prl.protocol.messages import Scores


@dataclass
class _MinerWindow:
    counts: dict[int, int] = field(default_factory=dict)  # version -> valid unique rollouts
    failures: set[int] = field(default_factory=set)  # versions with a hard failure


class ScoreBook:
    """Sliding-window scores of the miners one validator has judged."""

    def __init__(self, window: int, max_miners: int = 4096) -> None:
        if window < 1 or max_miners < 1:
            raise ValueError("window and max_miners must be >= 1")
        self.window = window
        self.max_miners = max_miners
        self._miners: OrderedDict[str, _MinerWindow] = OrderedDict()
        self.latest = 0

    def record(self, miner: str, version: int, valid_unique: int, hard_failure: bool = False) -> None:
        """Add one batch's outcome (``miner`` hex key, the version its rollouts claim)."""
        if valid_unique < 0:
            raise ValueError("valid_unique must be >= 0")
        self.latest = max(self.latest, version)
        w = self._miners.pop(miner, None) or _MinerWindow()
        self._miners[miner] = w
        if hard_failure:
            w.failures.add(version)
        elif valid_unique:
            w.counts[version] = w.counts.get(version, 0) + valid_unique
        self._prune(w, self.latest)
        while len(self._miners) > self.max_miners:
            self._miners.popitem(last=False)

    def _prune(self, w: _MinerWindow, current: int) -> None:
        lo = current - self.window + 1
        for v in [v for v in w.counts if v < lo]:
            del w.counts[v]
        w.failures = {v for v in w.failures if v >= lo}

    def score(self, miner: str, current: int | None = None) -> int:
        cur = self.latest if current is None else current
        w = self._miners.get(miner)
        if w is None:
            return 0
        lo = cur - self.window + 1
        if any(lo <= v <= cur for v in w.failures):
            return 0
        return sum(c for v, c in w.counts.items() if lo <= v <= cur)

    def scores(self, current: int | None = None) -> dict[str, int]:
        cur = self.latest if current is None else current
        return {m: self.score(m, cur) for m in self._miners}

    def to_message(self, current: int | None = None) -> Scores:
        """The Scores body a validator signs and gossips."""
        cur = self.latest if current is None else current
        return Scores(version=cur, window=self.window, scores=self.scores(cur))
