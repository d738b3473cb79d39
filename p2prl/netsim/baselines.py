"""What the swarm is measured against, on the same simulated links: a star and a relay tree.

Star: the trainer sends the whole patch to every peer at once (every peer dials it), its uplink
shared equally, so its upload is N × the patch. Relay tree: the trainer sends to ``fanout``
children, each of which forwards every chunk to its own children as soon as it holds it (chunk
by chunk, so the levels overlap); public peers with the fastest uplinks sit nearest the root and
NATed peers are leaves under public parents they dial. The trainer uploads ``fanout`` × the patch.
"""

from __future__ import annotations

import collections

from p2prl.netsim.links import Links, Sim
from p2prl.netsim.population import Population, Spec


class _Base:
    def __init__(self, spec: Spec, pop: Population) -> None:
        self.sim = Sim()
        self.links = Links(self.sim, pop.up, pop.down)
        self.lat = spec.latency_s
        self.size, self.chunk = spec.size, spec.chunk
        self.n = max(1, -(-self.size // self.chunk))
        self.pop = pop
        self.done_at: list[float | None] = [0.0] + [None] * (len(pop.up) - 1)

    def run(self, until: float = 3600.0) -> None:
        self.sim.run(until)


class StarSim(_Base):
    def __init__(self, spec: Spec, pop: Population) -> None:
        super().__init__(spec, pop)
        for i in range(1, len(pop.up)):  # the request reaches the trainer one latency after start
            self.sim.at(pop.start[i] + self.lat, self._send, i)

    def _send(self, i: int) -> None:
        self.links.start(0, i, self.size, self._sent, i)

    def _sent(self, i: int) -> None:
        self.sim.after(self.lat, self._arrived, i)

    def _arrived(self, i: int) -> None:
        self.done_at[i] = self.sim.now


def tree_parents(pop: Population, fanout: int) -> list[int]:
    """Parent of each peer: a ``fanout``-ary heap over the trainer and the public peers (fastest
    uplinks first), then each NATed peer under the shallowest public node with room."""
    n = len(pop.up)
    public = sorted((i for i in range(1, n) if not pop.nat[i]), key=lambda i: -pop.up[i])
    order = [0, *public]
    parent = [-1] * n
    children = [0] * n
    for pos, node in enumerate(order[1:], start=1):
        parent[node] = order[(pos - 1) // fanout]
        children[parent[node]] += 1
    slots = collections.deque(order)  # breadth-first: shallow nodes first
    for i in (i for i in range(1, n) if pop.nat[i]):
        while len(slots) > 1 and children[slots[0]] >= fanout:
            slots.popleft()
        parent[i] = slots[0]
        children[slots[0]] += 1
    return parent


class TreeSim(_Base):
    def __init__(self, spec: Spec, pop: Population, fanout: int = 4) -> None:
        super().__init__(spec, pop)
        self.parent = tree_parents(pop, fanout)
        self.kids: list[list[int]] = [[] for _ in pop.up]
        for i, p in enumerate(self.parent):
            if p >= 0:
                self.kids[p].append(i)
        self.held = [self.n] + [0] * (len(pop.up) - 1)  # chunks held (in order)
        self.next = [0] * len(pop.up)  # next chunk each peer's parent sends it
        self.ready = [False] * len(pop.up)  # peer has asked its parent (started + one latency)
        self.sending = [False] * len(pop.up)
        for i in range(1, len(pop.up)):
            self.sim.at(pop.start[i] + self.lat, self._ask, i)

    def _ask(self, i: int) -> None:
        self.ready[i] = True
        self._pump(i)

    def _pump(self, i: int) -> None:
        """Start the next chunk from i's parent to i, if the parent holds it and the link is free."""
        p = self.parent[i]
        if self.ready[i] and not self.sending[i] and self.next[i] < min(self.n, self.held[p]):
            self.sending[i] = True
            c = self.next[i]
            self.next[i] += 1
            self.links.start(p, i, min(self.chunk, self.size - c * self.chunk), self._sent, i)

    def _sent(self, i: int) -> None:
        self.sending[i] = False
        self.sim.after(self.lat, self._arrived, i)
        self._pump(i)

    def _arrived(self, i: int) -> None:
        self.held[i] += 1
        if self.held[i] == self.n:
            self.done_at[i] = self.sim.now
        for k in self.kids[i]:
            self._pump(k)
