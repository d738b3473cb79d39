"""The swarm's decisions, free of I/O: which chunk to ask a provider for, and whether a superseeding
node may upload another copy of a chunk.

They take the clock as an argument, so the live download (``net/swarm.py``) and the network
simulator (``p2prl/netsim``) run the very same rules, one on ``time.monotonic()``, the other on
simulated time.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Hashable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

BUSY_RETRY_S = 0.25  # a chunk a provider answered BUSY for is not asked of it again for this long
IDLE_MIN_S = 0.02  # a worker with nothing to ask sleeps this long, doubling up to IDLE_MAX_S
IDLE_MAX_S = 0.4
RECRUIT_S = 0.2  # a download looks for new providers this often
COMPLETE_HOLDER_WAIT_S = 1.0  # complete holders are spared while partial holders made progress this recently
MAX_CANDIDATES = 32  # rarest-first looks at a random sample of this many candidate chunks
# chunks a superseeding node uploads at once. On an idle testbed (8 peers, 50 Mbit/s, 64 MiB) a limit
# of 2 took 2.26x one transfer and no limit 1.48x; the simulator, within 20% of the testbed, gives
# 2.8x (2), 2.0x (8) and 1.35x (no limit) at 16 peers: the serving slots per peer are the bound
SUPERSEED_PARALLEL = 64


def pick_chunk(
    peer: Hashable,
    bitmap: Sequence[bool],
    have: Sequence[bool],
    inflight: Collection[int],
    busy: Mapping[tuple[Any, int], float],
    bitmaps: Mapping[Any, Sequence[bool]],
    now: float,
    last_peer_progress: float,
    rng: random.Random | None = None,
) -> int | None:
    """The chunk to ask ``peer`` (whose HAVE bitmap is ``bitmap``) for next, or None.

    Rarest first among the chunks the peer holds and we neither hold, nor have in flight, nor were
    told BUSY for (random among equals, so downloaders spread out). A complete holder (often the
    publisher) is asked only for what no partial holder can serve: its uplink is the scarce one.
    """
    r = rng or random
    cands = [
        i
        for i in range(len(have))
        if bitmap[i] and not have[i] and i not in inflight and busy.get((peer, i), 0.0) <= now
    ]
    if not cands:
        return None
    if all(bitmap):
        # partial holders re-serve each chunk as soon as they verify it
        others = [b for p, b in bitmaps.items() if p != peer]
        rare = [i for i in cands if not any(b[i] for b in others)]
        if rare:
            cands = rare
        else:
            partial = [b for b in others if not all(b)]
            if (
                any(b[i] for b in partial for i in cands)
                and now - last_peer_progress < COMPLETE_HOLDER_WAIT_S
            ):
                return None
    if len(cands) > MAX_CANDIDATES:
        cands = r.sample(cands, MAX_CANDIDATES)
    maps = list(bitmaps.values())
    return min(cands, key=lambda i: (sum(1 for b in maps if b[i]), r.random()))


def provider_order(me: str, blob_id: str, hinted: Sequence[str], connected: Iterable[str]) -> list[str]:
    """Peers to ask for ``blob_id``: the hinted ones first (in hint order), then the connected ones
    in an order of this node's own for this blob (a hash of both ids and the peer's).

    Every downloader taking the same first ``max_providers`` peers (the lowest ids, as before) left a
    chunk the publisher gave to anyone else unasked and rare: past 16 peers the swarm stalled on the
    publisher's next superseed copy (docs/SIMULATION.md). Own orders spread the downloaders over
    all holders; a hash, not a shuffle per call, keeps the order stable while peers come and go.
    """
    seen = set(hinted)
    salt = f"{me}/{blob_id}/".encode()
    rest = sorted(
        (p for p in set(connected) if p not in seen),
        key=lambda p: hashlib.blake2b(salt + p.encode(), digest_size=8).digest(),
    )
    return [*hinted, *rest]


def may_upload_copy(
    uploads: MutableMapping[tuple[str, int], tuple[int, float]],
    key: tuple[str, int],
    now: float,
    cooldown_s: float,
    in_flight: int = 0,
    max_keys: int = 65536,
) -> bool:
    """Superseeding: the k-th upload of a chunk is allowed k-1 cooldowns after its first one, and
    at most ``SUPERSEED_PARALLEL`` chunks are on the wire at once (``in_flight`` now), a bound far
    above the peers a publisher serves at once (docs/SIMULATION.md).

    ``uploads`` maps (blob id, chunk index) to (copies uploaded so far, time of the first); an
    allowed upload is counted in it. Bounded: past ``max_keys`` entries it starts afresh.
    """
    if in_flight >= SUPERSEED_PARALLEL:
        return False
    count, first = uploads.get(key, (0, now))
    if count > (now - first) / cooldown_s:
        return False
    uploads[key] = (count + 1, first)
    if len(uploads) > max_keys:
        uploads.clear()
    return True
