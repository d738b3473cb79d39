"""What the validator judges next: announcements queued fairly per signer, each (signer, blob) once.

One validation thread judges every batch, so a peer that floods it, or announces blobs nobody
serves, must not be able to starve honest miners:

- each signer has its own queue with a quota (``per_signer``); signers are served round-robin, in
  three classes by standing: miners with an accepted batch first, then keys never judged, then keys
  penalized for hard failures or repeatedly unfetchable blobs (new keys are free to make, standing
  costs compute);
- an announcement whose blob could not be fetched leaves a negative-cache entry (the same
  (signer, blob) is not fetched again for ``negative_ttl_s``) and a strike against its signer;
- judged (signer, blob id) pairs are remembered for the whole staleness window, so no flood can get
  an old honest batch judged again (which would fail it as a duplicate and zero its miner). The
  memory is bounded; over the bound, the signer holding the most entries loses its oldest.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Collection
from typing import Any

from p2prl.lru import LRU
from p2prl.reasons import NodeDrop

PER_SIGNER = 8  # announcements queued per signer
QUEUE_MAX = 256  # announcements queued in all
WAIT_FOR_VERSION_S = 60.0  # how long an announcement from the future waits for our sync
NEGATIVE_TTL_S = 600.0
NEGATIVE_MAX = 4096
JUDGED_MAX = 65536
STRIKES_TO_PENALIZE = 2
STANDING_MAX = 8192

GOOD, NEW, PENALIZED = 0, 1, 2
Key = tuple[str, str]  # (signer hex, blob id)


def key_of(item: Any) -> Key:
    return item.envelope.signer_hex, item.message.blob.id


class Judged:
    """(signer, blob id) pairs judged at versions still inside the staleness window."""

    def __init__(self, max_staleness: int, capacity: int = JUDGED_MAX) -> None:
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._by_signer: dict[str, OrderedDict[str, int]] = {}
        self._n = 0

    def __contains__(self, key: Key) -> bool:
        return key[1] in self._by_signer.get(key[0], {})

    def __len__(self) -> int:
        return self._n

    def add(self, key: Key, version: int) -> None:
        signer, blob = key
        mine = self._by_signer.setdefault(signer, OrderedDict())
        if blob not in mine:
            self._n += 1
        mine[blob] = version
        while self._n > self.capacity:
            big = max(self._by_signer, key=lambda s: len(self._by_signer[s]))
            self._pop(big, next(iter(self._by_signer[big])))

    def prune(self, current: int) -> None:
        """Forget pairs whose version is out of the window: they can no longer be judged anyway."""
        lo = current - self.max_staleness
        for signer in list(self._by_signer):
            for blob in [b for b, v in self._by_signer[signer].items() if v < lo]:
                self._pop(signer, blob)

    def _pop(self, signer: str, blob: str) -> None:
        mine = self._by_signer[signer]
        del mine[blob]
        self._n -= 1
        if not mine:
            del self._by_signer[signer]


class JudgeQueue:
    """Per-signer fair queue of announcements (gossip ``Incoming`` items) with standing classes."""

    def __init__(
        self,
        max_staleness: int,
        per_signer: int = PER_SIGNER,
        total: int = QUEUE_MAX,
        wait_s: float = WAIT_FOR_VERSION_S,
    ) -> None:
        self.per_signer = per_signer
        self.total = total
        self.wait_s = wait_s
        self.judged = Judged(max_staleness)
        self._queues: list[OrderedDict[str, deque[tuple[float, Any]]]] = [OrderedDict() for _ in range(3)]
        self._n = 0
        self.evicted = 0  # queued announcements dropped to make room for better-standing ones
        self._negative: LRU[Key, float] = LRU(NEGATIVE_MAX)
        self._strikes: LRU[str, int] = LRU(STANDING_MAX)
        self._good: LRU[str, None] = LRU(STANDING_MAX)

    def __len__(self) -> int:
        return self._n

    def standing(self, signer: str) -> int:
        if self._strikes.get(signer, 0) >= STRIKES_TO_PENALIZE:
            return PENALIZED
        return GOOD if signer in self._good else NEW

    def offer(self, item: Any, now: float | None = None) -> NodeDrop | None:
        """Queue an announcement; returns a reason code when it is dropped instead."""
        now = time.monotonic() if now is None else now
        key = key_of(item)
        if key in self.judged:
            return NodeDrop.DUPLICATE_ANNOUNCEMENT
        t = self._negative.get(key)
        if t is not None and now - t < NEGATIVE_TTL_S:
            return NodeDrop.KNOWN_UNFETCHABLE
        signer = key[0]
        q = self._find(signer)
        if q is not None and any(key_of(i) == key for _, i in q):
            return NodeDrop.DUPLICATE_ANNOUNCEMENT
        if q is not None and len(q) >= self.per_signer:
            return NodeDrop.SIGNER_QUOTA
        if self._n >= self.total and not self._evict_below(self.standing(signer)):
            return NodeDrop.VALIDATOR_QUEUE_FULL
        if q is None:
            q = self._queues[self.standing(signer)].setdefault(signer, deque())
        q.append((now, item))
        self._n += 1
        return None

    def _find(self, signer: str) -> deque[tuple[float, Any]] | None:
        for cls in self._queues:
            if signer in cls:
                return cls[signer]
        return None

    def _evict_below(self, cls: int) -> bool:
        """Make room by dropping the newest item of the longest queue in a class no better than ``cls``."""
        for c in range(len(self._queues) - 1, cls - 1, -1):
            queues = self._queues[c]
            if queues:
                signer = max(queues, key=lambda s: len(queues[s]))
                queues[signer].pop()
                if not queues[signer]:
                    del queues[signer]
                self._n -= 1
                self.evicted += 1
                return True
        return False

    def next(
        self, current: int, now: float | None = None, classes: int = 3, skip: Collection[str] = ()
    ) -> Any:
        """The next announcement to judge: best class first, round-robin over signers within it.

        Announcements for a version we do not hold yet wait (up to ``wait_s``) without blocking
        others. ``classes`` 1 takes only signers in good standing. Signers in ``skip`` (one of
        theirs is being fetched or judged) wait, so each signer's batches are judged in the order
        they were announced: prompt indices must continue the last judged batch.
        """
        now = time.monotonic() if now is None else now
        for queues in self._queues[:classes]:
            for signer in list(queues):
                if signer in skip:
                    continue
                q = queues[signer]
                for i, (t, item) in enumerate(q):
                    if item.message.version <= current or now - t > self.wait_s:
                        del q[i]
                        self._n -= 1
                        queues.pop(signer)
                        if q:
                            queues[signer] = q  # to the back of its class: round-robin
                        return item
        return None

    # -- outcomes --------------------------------------------------------------------------------
    def judged_ok(self, item: Any, accepted: bool, hard_failure: bool) -> None:
        """Record a judgement: standing rises with an accepted batch and falls with a hard failure."""
        key = key_of(item)
        self.judged.add(key, item.message.version)
        if hard_failure:
            self._strike(key[0], STRIKES_TO_PENALIZE)
            self._good.pop(key[0], None)
        elif accepted:
            self._strikes.pop(key[0], None)
            self._good.put(key[0], None)
        self._restand(key[0])

    def unfetchable(self, item: Any, now: float | None = None) -> None:
        """The blob could not be fetched: a negative-cache entry and a strike against its signer."""
        key = key_of(item)
        self._negative.put(key, time.monotonic() if now is None else now)
        self._strike(key[0], 1)
        self._restand(key[0])

    def _strike(self, signer: str, n: int) -> None:
        self._strikes.put(signer, self._strikes.get(signer, 0) + n)

    def _restand(self, signer: str) -> None:
        """Move a signer's waiting announcements to its current class."""
        q = None
        for queues in self._queues:
            q = queues.pop(signer, None) or q
        if q:
            self._queues[self.standing(signer)][signer] = q
