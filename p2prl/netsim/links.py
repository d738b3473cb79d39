"""Event loop and flow-level links: each peer has an uplink and a downlink rate, shared equally.

A transfer (one chunk, or a whole blob) is a flow from one peer's uplink to another's downlink; its
rate is the smaller of the sender's equal share of its uplink and the receiver's equal share of its
downlink. Rates are recomputed whenever flows start or end (for the peers concerned only, once per
distinct instant), so the cost is per chunk, never per byte. Equal shares are what concurrent TCP
flows converge to on one bottleneck; unlike max-min fairness, a share a receiver cannot take is not
handed to the sender's other flows, so throughput is, if anything, underestimated.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class Sim:
    """A clock and an event heap; events at one instant run in the order they were scheduled."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events = 0
        self.links: Links | None = None

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        links = self.links
        while True:
            if links is not None and links.dirty and (not heap or heap[0][0] > self.now):
                links.settle()  # rates for the flows that changed at this instant
                continue
            if not heap:
                break
            t = heap[0][0]
            if t > until or (stop is not None and stop()):
                break
            _, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)


class Flow:
    __slots__ = ("alive", "args", "dst", "on_done", "rate", "remaining", "size", "src", "t", "version")

    def __init__(
        self, src: int, dst: int, size: float, now: float, on_done: Callable[..., None], args: tuple
    ) -> None:
        self.src = src
        self.dst = dst
        self.size = size
        self.remaining = float(size)
        self.rate = 0.0
        self.t = now
        self.version = 0
        self.alive = True
        self.on_done = on_done
        self.args = args


class Links:
    """Per-peer uplink and downlink rates in bytes per second, and the flows over them."""

    def __init__(self, sim: Sim, up: list[float], down: list[float]) -> None:
        self.sim = sim
        sim.links = self
        self.up = up
        self.down = down
        self.out: list[dict[Flow, None]] = [{} for _ in up]
        self.inc: list[dict[Flow, None]] = [{} for _ in up]
        self.dirty: dict[int, None] = {}
        self.bytes_up = [0.0] * len(up)

    def start(self, src: int, dst: int, size: float, on_done: Callable[..., None], *args: Any) -> Flow:
        f = Flow(src, dst, size, self.sim.now, on_done, args)
        self.out[src][f] = None
        self.inc[dst][f] = None
        self.dirty[src] = None
        self.dirty[dst] = None
        return f

    def _remove(self, f: Flow) -> None:
        f.alive = False
        del self.out[f.src][f]
        del self.inc[f.dst][f]
        self.dirty[f.src] = None
        self.dirty[f.dst] = None

    def cancel(self, f: Flow) -> None:
        """Abort a flow (its stream was closed); the bytes sent so far count as uploaded."""
        if not f.alive:
            return
        sent = f.size - (f.remaining - f.rate * (self.sim.now - f.t))
        self.bytes_up[f.src] += max(0.0, min(f.size, sent))
        self._remove(f)

    def settle(self) -> None:
        now = self.sim.now
        flows: dict[Flow, None] = {}
        for n in self.dirty:
            flows.update(self.out[n])
            flows.update(self.inc[n])
        self.dirty.clear()
        up, down, out, inc = self.up, self.down, self.out, self.inc
        for f in flows:
            rate = min(up[f.src] / len(out[f.src]), down[f.dst] / len(inc[f.dst]))
            if rate == f.rate:
                continue
            f.remaining -= f.rate * (now - f.t)
            f.t = now
            f.rate = rate
            f.version += 1
            self.sim.at(now + max(0.0, f.remaining) / rate, self._done, f, f.version)

    def _done(self, f: Flow, version: int) -> None:
        if not f.alive or version != f.version:
            return
        self.bytes_up[f.src] += f.size
        self._remove(f)
        f.on_done(*f.args)
