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
  memory is bounded, and what it forgets over the bound does not depend on how many keys fill it:
  a pair whose judgement accepted a group, or whose signer was in good standing and did not fail
  hard, is kept until its version leaves the window; only the other pairs (junk, which any number of
  fresh keys can make) are forgotten, oldest first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Collection

from p2prl.lru import LRU
from p2prl.net import Incoming
from p2prl.protocol import RolloutAnnouncement
from p2prl.reasons import NodeDrop

PER_SIGNER = 8  # announcements queued per signer
QUEUE_MAX = 256  # announcements queued in all
WAIT_FOR_VERSION_S = 60.0  # how long an announcement from the future waits for our sync
NEGATIVE_TTL_S = 600.0
NEGATIVE_MAX = 4096
JUDGED_MAX = 65536
STRIKES_TO_PENALIZE = 2
SHED_PER_SIGNER = 24  # announcements over the quota kept as markers to pass over (beyond: dropped)
STANDING_MAX = 8192

GOOD, NEW, PENALIZED = 0, 1, 2
Key = tuple[str, str]  # (signer hex, blob id)


Announcement = Incoming[RolloutAnnouncement]  # a queued item: gossip from the rollouts topic


def key_of(item: Announcement) -> Key:
    return item.envelope.signer_hex, item.message.blob.id


class Judged:
    """(signer, blob id) pairs judged at versions still inside the staleness window.

    Two tiers: ``kept`` pairs (honest work: see ``add``) leave only when their version leaves the
    window, or, should ``capacity`` pairs of them fill one window, the oldest version first, which
    takes ``capacity`` accepted batches, not keys; the ``rest`` are forgotten oldest first when the
    memory is full. Forgetting a junk pair lets its replay be judged again, which fails only its
    own signer.
    """

    def __init__(self, max_staleness: int, capacity: int = JUDGED_MAX) -> None:
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._kept: dict[Key, int] = {}
        self._rest: OrderedDict[Key, int] = OrderedDict()
        self.forgotten = 0  # pairs dropped over the bound before their window ended

    def __contains__(self, key: Key) -> bool:
        return key in self._kept or key in self._rest

    def __len__(self) -> int:
        return len(self._kept) + len(self._rest)

    def add(self, key: Key, version: int, keep: bool = False) -> None:
        """Remember ``key`` judged at ``version``; ``keep``: honest work, never forgotten for junk."""
        if keep:
            self._rest.pop(key, None)
            self._kept[key] = version
        elif key not in self._kept:
            self._rest[key] = version
            self._rest.move_to_end(key)
        while len(self) > self.capacity:
            if self._rest:
                self._rest.popitem(last=False)
            else:
                del self._kept[min(self._kept, key=self._kept.__getitem__)]
            self.forgotten += 1

    def prune(self, current: int) -> None:
        """Forget pairs whose version is out of the window: they can no longer be judged anyway."""
        lo = current - self.max_staleness
        for tier in (self._kept, self._rest):
            for key in [k for k, v in tier.items() if v < lo]:
                del tier[key]


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
        self._queues: list[OrderedDict[str, deque[tuple[float, Announcement]]]] = [
            OrderedDict() for _ in range(3)
        ]
        self._n = 0
        self.evicted = 0  # queued announcements dropped to make room for better-standing ones
        self._negative: LRU[Key, float] = LRU(NEGATIVE_MAX)
        self._strikes: LRU[str, int] = LRU(STANDING_MAX)
        self._good: LRU[str, None] = LRU(STANDING_MAX)
        # announcements over a signer's quota, queued in order as markers: the judge answers each by
        # passing over its announced indices (no fetch), so shedding leaves no gap in the miner's
        # prompt indices (docs/PROTOCOL.md §13)
        self._shed: dict[str, int] = {}
        self._shed_keys: set[Key] = set()

    def __len__(self) -> int:
        return self._n

    def _shed_in(self, signer: str) -> int:
        return self._shed.get(signer, 0)

    def take_shed(self, item: Announcement) -> bool:
        """True if ``item`` (just taken by ``next``) was shed over its signer's quota: pass it over."""
        key = key_of(item)
        if key not in self._shed_keys:
            return False
        self._shed_keys.discard(key)
        n = self._shed.pop(key[0], 1) - 1
        if n > 0:
            self._shed[key[0]] = n
        return True

    def oldest_age(self, now: float | None = None) -> float:
        """Seconds the longest-waiting queued announcement has waited (0 when none waits)."""
        now = time.monotonic() if now is None else now
        return max((now - q[0][0] for cls in self._queues for q in cls.values() if q), default=0.0)

    def standing(self, signer: str) -> int:
        if self._strikes.get(signer, 0) >= STRIKES_TO_PENALIZE:
            return PENALIZED
        return GOOD if signer in self._good else NEW

    def offer(self, item: Announcement, now: float | None = None) -> NodeDrop | None:
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
        if q is not None and len(q) - self._shed_in(signer) >= self.per_signer:
            if self._shed_in(signer) >= SHED_PER_SIGNER:
                return NodeDrop.SIGNER_QUOTA
            q.append((now, item))  # kept in order as a marker only: its indices are passed over
            self._shed[signer] = self._shed_in(signer) + 1
            self._shed_keys.add(key)
            self._n += 1
            return NodeDrop.SIGNER_QUOTA
        if self._n >= self.total and not self._evict_below(self.standing(signer)):
            return NodeDrop.VALIDATOR_QUEUE_FULL
        if q is None:
            q = self._queues[self.standing(signer)].setdefault(signer, deque())
        q.append((now, item))
        self._n += 1
        return None

    def _find(self, signer: str) -> deque[tuple[float, Announcement]] | None:
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
                _, dropped = queues[signer].pop()
                self.take_shed(dropped)
                if not queues[signer]:
                    del queues[signer]
                self._n -= 1
                self.evicted += 1
                return True
        return False

    def next(
        self, current: int, now: float | None = None, classes: int = 3, skip: Collection[str] = ()
    ) -> Announcement | None:
        """The next announcement to judge: best class first, round-robin over signers within it.

        Announcements for a version we do not hold yet wait (up to ``wait_s``) without blocking
        others. ``classes`` 1 takes only signers in good standing. Signers in ``skip`` (one of
        theirs is being fetched or judged) wait, so each signer's batches are judged one at a time,
        oldest signed first: prompt indices must continue the last judged batch.
        """
        now = time.monotonic() if now is None else now
        for queues in self._queues[:classes]:
            for signer in list(queues):
                if signer in skip:
                    continue
                q = queues[signer]
                ready = [
                    i
                    for i, (t, item) in enumerate(q)
                    if item.message.version <= current or now - t > self.wait_s
                ]
                if not ready:
                    continue
                # the miner's own order (signed version, then signing time), not the order gossip
                # delivered them in: one path may bring a miner's second batch before its first
                i = min(ready, key=lambda j: (q[j][1].message.version, q[j][1].message.created_ms))
                item = q[i][1]
                del q[i]
                self._n -= 1
                queues.pop(signer)
                if q:
                    queues[signer] = q  # to the back of its class: round-robin
                return item
        return None

    # -- outcomes --------------------------------------------------------------------------------
    def judged_ok(self, item: Announcement, accepted: bool, hard_failure: bool) -> None:
        """Record a judgement: standing rises with an accepted batch and falls with a hard failure."""
        key = key_of(item)
        keep = not hard_failure and (accepted or key[0] in self._good)
        self.judged.add(key, item.message.version, keep=keep)
        if hard_failure:
            self._strike(key[0], STRIKES_TO_PENALIZE)
            self._good.pop(key[0], None)
        elif accepted:
            self._strikes.pop(key[0], None)
            self._good.put(key[0], None)
        self._restand(key[0])

    def unfetchable(self, item: Announcement, now: float | None = None) -> None:
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
