"""The trainer's intake: which announced rollout blobs to fetch, on which validators' verdicts.

Any key may announce anything, so the intake trusts nothing an announcement says about others:

- announcements are held by their envelope digest, and a verdict names the one it judged
  (``Verdict.announcement``): the same blob id announced under another key is another entry, never
  a replacement, and cannot take or spoil the honest miner's verdict (blob-id squatting);
- consumed and vetoed blobs are keyed by (miner, blob id);
- a signer holds at most ``per_signer`` announcements; when the cache is full the oldest
  announcement of a signer never accepted before goes first, so a flood evicts the flooders' own
  entries (one key) or other unproven keys' (many keys), not those of miners with accepted work;
- a hard-failure verdict from any genesis validator vetoes the blob; with several validators an
  accepted blob waits for all of them (at most ``wait_s``) before it is released for fetching.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from p2prl.lru import LRU
from p2prl.protocol import RolloutAnnouncement, Verdict
from p2prl.reasons import NodeDrop

PER_SIGNER = 16  # announcements held per signer
CACHE = 2048  # announcements held in all
TRUSTED = 4096  # miners remembered as having had a batch accepted
VERDICT_WAIT_S = 10.0  # how long an accepted blob waits for the other validators' verdicts

Key = tuple[str, str]  # (miner hex, blob id)


@dataclass
class Held:
    ann: RolloutAnnouncement
    miner: str
    origin: str


@dataclass
class Pending:
    held: Held
    since: float  # first accepting verdict
    accepted: set[int] = field(default_factory=set)
    voters: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Job:
    """A blob to fetch: its announcement, miner, the group indices accepted, and who announced it."""

    ann: RolloutAnnouncement
    miner: str
    accepted: set[int]
    origin: str


class Intake:
    def __init__(
        self,
        validators: int,
        hard_reasons: frozenset[str],
        per_signer: int = PER_SIGNER,
        cache: int = CACHE,
        wait_s: float = VERDICT_WAIT_S,
    ) -> None:
        self.validators = max(1, validators)
        self.hard = hard_reasons
        self.per_signer = per_signer
        self.cache = cache
        self.wait_s = wait_s
        self.held: OrderedDict[str, Held] = OrderedDict()  # envelope digest -> announcement
        self.by_signer: dict[str, OrderedDict[str, None]] = {}
        self.pending: LRU[Key, Pending] = LRU(cache)
        self.done: LRU[Key, bool] = LRU(4 * cache)  # True: vetoed
        self.trusted: LRU[str, None] = LRU(TRUSTED)

    # -- announcements --------------------------------------------------------------------------
    def announce(self, digest: str, ann: RolloutAnnouncement, miner: str, origin: str) -> NodeDrop | None:
        """Hold an announcement; returns a reason code when it is not held."""
        if digest in self.held:
            return NodeDrop.DUPLICATE_ANNOUNCEMENT
        mine = self.by_signer.setdefault(miner, OrderedDict())
        if len(mine) >= self.per_signer:
            self._drop(next(iter(mine)))  # a signer over its cap loses its own oldest
        self.held[digest] = Held(ann, miner, origin)
        self.by_signer[miner][digest] = None
        while len(self.held) > self.cache:
            self._drop(self._victim())
        return None

    def _victim(self) -> str:
        """The oldest announcement of a signer with no accepted batch; else the oldest of all."""
        for digest, h in self.held.items():
            if h.miner not in self.trusted:
                return digest
        return next(iter(self.held))

    def _drop(self, digest: str) -> None:
        h = self.held.pop(digest)
        mine = self.by_signer[h.miner]
        mine.pop(digest, None)
        if not mine:
            del self.by_signer[h.miner]

    # -- verdicts -------------------------------------------------------------------------------
    def verdict(self, validator: str, v: Verdict, now: float) -> NodeDrop | None:
        """Record one genesis validator's verdict; returns a reason code when it changes nothing."""
        key = (v.miner, v.blob_id)
        if any(not g.accepted and g.reason in self.hard for g in v.groups):
            # a genesis validator found proof of cheating in what this miner signed: veto, even if
            # the blob is already released (the fetch checks ``vetoed`` before using it)
            self.pending.pop(key, None)
            self._decide(key, vetoed=True)
            return NodeDrop.VERDICT_VETO
        if key in self.done:
            return NodeDrop.VERDICT_AFTER_DECISION
        h = self.held.get(v.announcement)
        if h is None:
            return NodeDrop.VERDICT_UNKNOWN_BLOB
        if h.miner != v.miner or h.ann.blob.id != v.blob_id or h.ann.version != v.version:
            return NodeDrop.VERDICT_MISMATCH
        accepted = {g.index for g in v.groups if g.accepted}
        p = self.pending.get(key)
        if p is None:
            p = self.pending[key] = Pending(h, now)
        if accepted and not p.accepted:
            p.since = now
        p.accepted |= accepted
        p.voters.add(validator)
        return None

    def ready(self, now: float) -> list[Job]:
        """Blobs no validator vetoed that have an accepting verdict and all verdicts (or waited enough)."""
        out = []
        for key, p in list(self.pending.items()):
            everyone = len(p.voters) >= self.validators
            if not p.accepted:
                if everyone:
                    del self.pending[key]  # judged by all, accepted by none
                continue
            prev = p.held.ann.prev
            if prev and (p.held.miner, prev) in self.pending and not everyone:
                continue  # a chained batch waits for the decision on the batch it follows
            if everyone or now - p.since >= self.wait_s:
                del self.pending[key]
                self._decide(key, vetoed=False)
                self.trusted.put(p.held.miner, None)
                out.append(Job(p.held.ann, p.held.miner, set(p.accepted), p.held.origin))
        return out

    def vetoed(self, miner: str, blob_id: str) -> bool:
        return bool(self.done.get((miner, blob_id)))

    def accepted(self, miner: str, blob_id: str) -> bool:
        """Released for training (an accepting verdict, no veto): a batch a chained one may follow."""
        return self.done.get((miner, blob_id)) is False

    def restore(self, decided: LRU[Key, bool]) -> None:
        """A restarted trainer's decisions (``chainlog``): what its chained batches follow, and the
        keys with an accepted batch."""
        for key, vetoed in decided.items():
            self._decide(key, vetoed)
            if not vetoed:
                self.trusted.put(key[0], None)

    def _decide(self, key: Key, vetoed: bool) -> None:
        self.done[key] = vetoed or self.done.get(key, False)

    def stats(self) -> dict[str, int]:
        return {"held": len(self.held), "signers": len(self.by_signer), "pending": len(self.pending)}
