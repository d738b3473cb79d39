"""Who is in the simulated network: uplinks, downlinks, NAT, when each peer starts, who dials whom.

Peer 0 is the trainer (public, the patch's publisher). The others draw an uplink log-uniformly
from a range (home DSL to fibre), a downlink 1, 5 or 10 times it (capped at the range's top: most
home links are asymmetric) and a NAT with a given probability, unless uniform links are asked
for (to compare with the testbed). A NATed peer accepts no inbound connection: it dials public
peers only, and two NATed peers are never connected (patches stay off relays).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

MBIT = 1e6 / 8  # bytes per second in one Mbit/s


@dataclass
class Spec:
    peers: int = 100
    patch_mib: float = 64.0
    chunk_kib: int = 1024
    up_mbit: tuple[float, float] = (10.0, 1000.0)  # range of peers' uplinks, log-uniform
    link_mbit: float = 0.0  # > 0: every link (trainer's too) this rate both ways
    up_override_mbit: float = 0.0  # > 0: every peer's uplink this rate (the trainer's too with link_mbit)
    trainer_mbit: float = 1000.0
    nat_share: float = 0.5
    latency_s: float = 0.025  # one way, per message
    join_spread_s: float = 0.0  # peers join uniformly over this long after the patch is published
    dial: int = 32  # public peers each peer dials (the node's Dialer keeps at most 32)
    seed: int = 1

    @property
    def size(self) -> int:
        return int(self.patch_mib * 1024 * 1024)

    @property
    def chunk(self) -> int:
        return self.chunk_kib * 1024


@dataclass
class Population:
    up: list[float]
    down: list[float]
    nat: list[bool]
    start: list[float]  # when each peer learns of the patch (join + gossip hops); trainer: 0
    conns: list[list[int]] = field(default_factory=list)  # connections, in the order they formed
    conn_at: list[list[float]] = field(default_factory=list)


def build(spec: Spec) -> Population:
    rng = random.Random(spec.seed)
    n = spec.peers + 1
    lo, hi = spec.up_mbit
    up, down, nat = [spec.trainer_mbit * MBIT], [spec.trainer_mbit * MBIT], [False]
    for _ in range(spec.peers):
        if spec.link_mbit > 0:
            u = d = spec.link_mbit
        else:
            u = math.exp(rng.uniform(math.log(lo), math.log(hi)))
            d = max(u, min(hi, u * rng.choice((1, 5, 10))))
        if spec.up_override_mbit > 0:
            u = spec.up_override_mbit
        up.append(u * MBIT)
        down.append(d * MBIT)
        nat.append(spec.link_mbit <= 0 and rng.random() < spec.nat_share)
    if spec.link_mbit > 0:  # the testbed's links: the publisher's like everyone's
        up[0] = (spec.up_override_mbit or spec.link_mbit) * MBIT
        down[0] = spec.link_mbit * MBIT
    hops = max(1, math.ceil(math.log(max(2, n)) / math.log(6)))  # gossip mesh of degree 6
    join = [0.0] + [rng.uniform(0, spec.join_spread_s) for _ in range(spec.peers)]
    start = [0.0] + [join[i] + spec.latency_s * rng.randint(1, hops) for i in range(1, n)]
    pop = Population(up, down, nat, start, [[] for _ in range(n)], [[] for _ in range(n)])
    # each peer, when it joins, dials the trainer (bootstrap) and up to `dial` public peers present
    order = sorted(range(1, n), key=lambda i: join[i])
    public_present: list[int] = [0]
    linked: set[tuple[int, int]] = set()
    for i in order:
        targets = [0, *rng.sample(public_present[1:], min(spec.dial, len(public_present) - 1))]
        for j in targets:
            key = (min(i, j), max(i, j))
            if key in linked:
                continue
            linked.add(key)
            for a, b in ((i, j), (j, i)):
                pop.conns[a].append(b)
                pop.conn_at[a].append(join[i])
        if not nat[i]:
            public_present.append(i)
    return pop
