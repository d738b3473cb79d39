"""Replay buffer keyed by policy version, with staleness-decayed sampling.

The trainer never waits on it: ``sample`` returns what is there (possibly fewer than asked, possibly
nothing). Groups are preferred the fresher they are — weight ``0.5 ** (staleness / half_life)`` with
``staleness = trainer_version − group.version`` — and dropped once ``staleness > max_staleness``.
Memory is bounded by ``capacity_groups``: when full, a group of the stalest version goes, picked
at random among them.

Neither sampling nor eviction looks at which key mined a group. Every group here was accepted by a
genesis validator, so a group is a unit of verified work, and a miner's share of a training batch is
its share of the (staleness-weighted) accepted groups held: splitting the same work over many keys
changes nothing (keys are free), and a key with no accepted group has no share. Fairness per key
(round-robin over miners) gave an operator with 20% of the groups spread over 64 keys 63 of the 64
groups of a batch.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

from p2prl.protocol import DEFAULT_MAX_STALENESS
from p2prl.rl.types import RolloutGroup


class ReplayBuffer:
    """Thread-safe bounded store of ``RolloutGroup``s. ``consume=True`` (default) hands each group out once."""

    def __init__(
        self, max_staleness: int = DEFAULT_MAX_STALENESS, half_life: float = 2.0, capacity_groups: int = 4096, seed: int = 0
    ) -> None:
        if max_staleness < 0 or half_life <= 0 or capacity_groups < 1:
            raise ValueError("need max_staleness >= 0, half_life > 0, capacity_groups >= 1")
        self.max_staleness = max_staleness
        self.half_life = half_life
        self.capacity_groups = capacity_groups
        self._groups: list[RolloutGroup] = []
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._trainer_version = 0
        self.dropped_full = 0
        self.evicted_stale = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._groups)

    def weight(self, staleness: int) -> float:
        """Sampling weight of a group this many versions old (0 beyond ``max_staleness`` or from the future)."""
        if staleness < 0 or staleness > self.max_staleness:
            return 0.0
        return float(0.5 ** (staleness / self.half_life))

    def add(self, group: RolloutGroup) -> bool:
        """Store a group; when full, one group of the stalest version (perhaps this one) goes, at random.

        Returns False when the group itself was dropped (already too stale, or the one picked).
        """
        with self._lock:
            if self._trainer_version - group.version > self.max_staleness:
                self.evicted_stale += 1
                return False
            if len(self._groups) >= self.capacity_groups:
                oldest = min(g.version for g in self._groups)
                stalest = [j for j, g in enumerate(self._groups) if g.version == oldest]
                if group.version < oldest or (
                    group.version == oldest and self._rng.randrange(len(stalest) + 1) == len(stalest)
                ):
                    self.dropped_full += 1
                    return False
                i = self._rng.choice(stalest)
                self._groups[i] = self._groups[-1]
                self._groups.pop()
                self.dropped_full += 1
            self._groups.append(group)
            return True

    def drop_miner(self, miner: str) -> int:
        """Drop every group ``miner`` mined (a key caught lying loses its share); returns how many."""
        with self._lock:
            keep = [g for g in self._groups if g.miner != miner]
            n = len(self._groups) - len(keep)
            self._groups = keep
            return n

    def evict(self, trainer_version: int) -> int:
        """Drop groups with staleness above ``max_staleness``; returns how many went."""
        with self._lock:
            return self._evict_locked(trainer_version)

    def _evict_locked(self, trainer_version: int) -> int:
        self._trainer_version = max(self._trainer_version, trainer_version)
        keep = [g for g in self._groups if trainer_version - g.version <= self.max_staleness]
        n = len(self._groups) - len(keep)
        self._groups = keep
        self.evicted_stale += n
        return n

    def sample(self, trainer_version: int, n: int, consume: bool = True) -> list[RolloutGroup]:
        """Up to ``n`` distinct groups drawn without replacement by staleness weight (never blocks).

        Evicts stale groups first. Groups claiming a version newer than ``trainer_version`` are skipped.
        Each group gets a weighted random key ``u ** (1 / w)`` (Efraimidis–Spirakis) and the ``n``
        highest keys are taken: which key mined a group plays no part, so a miner's expected share
        is its share of the staleness-weighted groups held.
        """
        with self._lock:
            self._evict_locked(trainer_version)
            keyed: list[tuple[float, int]] = []
            for i, g in enumerate(self._groups):
                w = self.weight(trainer_version - g.version)
                if w > 0:
                    keyed.append((self._rng.random() ** (1.0 / w), i))
            keyed.sort(reverse=True)
            chosen = sorted(i for _, i in keyed[: max(n, 0)])
            out = [self._groups[i] for i in chosen]
            if consume and chosen:
                drop = set(chosen)
                self._groups = [g for i, g in enumerate(self._groups) if i not in drop]
            return out

    def histogram(self, trainer_version: int | None = None) -> dict[int, int]:
        """Stored groups per staleness, relative to ``trainer_version`` (default: the last one seen)."""
        with self._lock:
            tv = self._trainer_version if trainer_version is None else trainer_version
            return dict(sorted(Counter(tv - g.version for g in self._groups).items()))
