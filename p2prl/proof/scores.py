"""Per-miner scores: valid unique rollouts over a sliding window of versions, zeroed by any hard failure.

A miner's score at version ``v`` is the number of unique rollouts the validator accepted from it for
versions ``v - window + 1 .. v``, or 0 while a hard failure (proof of cheating) lies in that window.
Only the validator's own version moves the window: a batch claiming a version outside
``[current - window + 1, current]`` counts for nothing (one claim of version 2^40 once zeroed
everyone). Memory is bounded: at most ``max_miners`` miners, and when full the miners scoring zero
(nothing valid in the window, or a hard failure) are forgotten first, then the least recently active,
so Sybil keys with rejected batches cannot push out miners with valid work. The gossiped message
omits zeros and is split in parts of ``PER_MESSAGE`` entries, so it stays under its size bound.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from p2prl.protocol import Scores, is_hex

PER_MESSAGE = 1024  # entries per Scores message: about 80 KiB, under its 128 KiB bound


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

    def record(
        self,
        miner: str,
        version: int,
        valid_unique: int,
        hard_failure: bool = False,
        current: int | None = None,
    ) -> None:
        """Add one judged batch's outcome (``miner`` hex key, the version its rollouts claim).

        ``current`` is the validator's own version (default: ``version``); a batch outside the window
        ending there is ignored, and only ``current`` advances the window.
        """
        if valid_unique < 0:
            raise ValueError("valid_unique must be >= 0")
        cur = version if current is None else current
        self.latest = max(self.latest, cur)
        if not self.latest - self.window < version <= self.latest:
            return
        w = self._miners.pop(miner, None) or _MinerWindow()
        self._miners[miner] = w
        if hard_failure:
            w.failures.add(version)
        elif valid_unique:
            w.counts[version] = w.counts.get(version, 0) + valid_unique
        self._prune(w, self.latest)
        if len(self._miners) > self.max_miners:
            self._evict()

    def _evict(self) -> None:
        """Forget one miner: the least recently active scoring zero, else the least recently active."""
        for m in self._miners:
            if self.score(m) == 0:
                del self._miners[m]
                return
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

    def state(self) -> dict[str, Any]:
        """What a validator keeps across a restart (JSON-able; miners least recently active first)."""
        return {
            "window": self.window,
            "latest": self.latest,
            "miners": [[m, {str(v): c for v, c in w.counts.items()}, sorted(w.failures)] for m, w in self._miners.items()],
        }

    def restore(self, state: Any) -> int:
        """Take back ``state()`` of an earlier run (this book's window and bound apply; entries that
        are not well formed are skipped); returns the miners taken back."""
        if not isinstance(state, dict) or type(state.get("latest")) is not int or not isinstance(state.get("miners"), list):
            return 0
        self.latest = max(self.latest, state["latest"])
        n = 0
        for entry in state["miners"][-self.max_miners :]:
            if not (isinstance(entry, list) and len(entry) == 3 and is_hex(entry[0], 32)):
                continue
            miner, counts, failures = entry
            if not (isinstance(counts, dict) and isinstance(failures, list)):
                continue
            w = _MinerWindow()
            for v, c in counts.items():
                if v.isdigit() and type(c) is int and c > 0:
                    w.counts[int(v)] = c
            w.failures = {v for v in failures if type(v) is int and v >= 0}
            self._prune(w, self.latest)
            self._miners.pop(miner, None)
            self._miners[miner] = w
            n += 1
        while len(self._miners) > self.max_miners:
            self._evict()
        return n

    def to_message(self, current: int | None = None) -> Scores:
        """One Scores body with every non-zero score (at most ``PER_MESSAGE``: see ``to_messages``)."""
        return self.to_messages(current)[0]

    def to_messages(self, current: int | None = None, per_message: int = PER_MESSAGE) -> list[Scores]:
        """The Scores bodies a validator signs and gossips: non-zero scores, highest first, in parts."""
        cur = self.latest if current is None else current
        ranked = sorted(((s, m) for m, s in self.scores(cur).items() if s > 0), reverse=True)
        parts = [ranked[i : i + per_message] for i in range(0, len(ranked), per_message)] or [[]]
        return [Scores(version=cur, window=self.window, scores={m: s for s, m in p}) for p in parts]
