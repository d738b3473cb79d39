"""The swarm download of one patch, simulated: the live download's worker loop on simulated streams.

Each downloader runs ``net/swarm.py``'s ``Download`` as a state machine: a provider recruiter
(hinted trainer first, then connected peers, at most ``max_providers``), one worker per provider on
one stream (HAVE for the bitmap, then up to ``pipeline_depth`` GETs in flight, answered in order),
the idle back-off and bitmap refresh, BUSY retries, the per-chunk timeout and the retry-after of a
provider that failed three times. Its choices are made by the live code's own functions
(``pick_chunk``, ``may_upload_copy``, ``UploadPacer``); each provider's chunk server admits at
most ``max_serving_streams`` streams and answers each stream's requests one after the other.
"""

from __future__ import annotations

import collections
import math
import random
from typing import Any

from p2prl.net import NetConfig, UploadPacer
from p2prl.net import selection as sel
from p2prl.netsim.links import Flow, Links, Sim
from p2prl.netsim.population import Population, Spec

OK, NOT_FOUND, BUSY = 0, 1, 2
BLOB = "patch"
PROVIDER_ORDERS = ("node", "id")  # the live order (net/selection.provider_order); the former one
FAILS_BEFORE_RETRY_AFTER = 3
RETRY_AFTER_S = 2.0


class Node:
    def __init__(self, idx: int, n_chunks: int, complete: bool) -> None:
        self.idx = idx
        self.have = [complete] * n_chunks
        self.have_at = [0.0 if complete else math.inf] * n_chunks  # when each chunk was verified
        self.count = n_chunks if complete else 0
        self.complete = complete
        self.done_at: float | None = 0.0 if complete else None
        self.conns: list[int] = []
        self.providers: list[int] | None = None
        self.serving = 0
        self.uploads: dict[tuple[str, int], tuple[int, float]] = {}
        self.seeding = 0  # superseed chunk uploads on the wire now
        self.pacer: UploadPacer | None = None
        self.superseed = False
        # download state (the fields of net/swarm.py's Download)
        self.started = False
        self.inflight: set[int] = set()
        self.bitmaps: dict[int, Any] = {}
        self.busy: dict[tuple[int, int], float] = {}
        self.retry_after: dict[int, float] = {}
        self.workers: dict[int, Worker] = {}
        self.last_peer_progress = 0.0
        self.recruit_phase = 0.0
        self.recruit_at: float | None = None


class Worker:
    """One downloader's stream to one provider, and the provider's side of that stream."""

    def __init__(self, d: Node, p: Node) -> None:
        self.d = d
        self.p = p
        self.gen = 0  # bumped when the stream closes: messages of an older stream are dropped
        self.open = False
        self.bitmap: Any = None
        self.pending: collections.deque[int] = collections.deque()
        self.fails = 0
        self.idle = sel.IDLE_MIN_S
        self.deadline = math.inf  # when the response awaited now times out
        self.timer = False  # a timeout check is on the event heap
        self.queue: collections.deque[int] = collections.deque()  # GETs the provider has read
        self.serving = False
        self.flow: Flow | None = None
        self.seeding = False  # the chunk on the wire is a superseed upload (counted in p.seeding)
        self.alive = True


class SwarmSim:
    def __init__(
        self,
        spec: Spec,
        pop: Population,
        cfg: NetConfig | None = None,
        cap_mb_s: float = 0.0,
        provider_order: str = "node",
    ) -> None:
        if provider_order not in PROVIDER_ORDERS:
            raise ValueError(f"provider order {provider_order!r}: one of {PROVIDER_ORDERS}")
        self.provider_order = provider_order
        self.spec = spec
        self.cfg = cfg or NetConfig(superseed=True, superseed_cooldown_s=1.0)
        self.rng = random.Random(spec.seed + 7)
        self.sim = Sim()
        self.links = Links(self.sim, pop.up, pop.down)
        self.size, self.chunk = spec.size, spec.chunk
        self.n = max(1, -(-self.size // self.chunk))
        self.lat = spec.latency_s
        self.nodes = [Node(i, self.n, i == 0) for i in range(len(pop.up))]
        self.nodes[0].superseed = self.cfg.superseed
        self.all_true = (True,) * self.n
        self.pid = list(range(len(self.nodes)))
        self.rng.shuffle(self.pid)  # peer ids: unrelated to uplinks or NAT
        self.stats = collections.Counter[str]()
        self.remaining = len(self.nodes) - 1
        for i, node in enumerate(self.nodes):
            if i and cap_mb_s > 0:
                node.pacer = UploadPacer(cap_mb_s * 1e6, max_wait_s=self.cfg.stream_timeout_s / 4)
                node.pacer.last = 0.0
            for j, t in zip(pop.conns[i], pop.conn_at[i], strict=True):
                self.sim.at(t, self._connect, node, j)
            if i:
                self.sim.at(pop.start[i], self._start, node)

    # ------------------------------------------------------------------ helpers

    def clen(self, i: int) -> int:
        return min(self.chunk, self.size - i * self.chunk)

    def run(self, until: float = 3600.0) -> None:
        self.sim.run(until, stop=lambda: self.remaining == 0)

    def _connect(self, node: Node, j: int) -> None:
        node.conns.append(j)
        node.providers = None
        if node.started and not node.complete:
            self._need_recruit(node, self.sim.now)

    def _providers(self, d: Node) -> list[int]:
        if d.providers is None:  # node.providers(): the hinted trainer first, then connected peers
            rest = [j for j in d.conns if j != 0]
            if self.provider_order == "id":  # the former order, lowest peer id first, to compare with
                rest.sort(key=self.pid.__getitem__)
            else:  # the live order: this node's own for this blob
                names = {f"peer{self.pid[j]}": j for j in rest}
                rest = [names[p] for p in sel.provider_order(f"peer{self.pid[d.idx]}", BLOB, (), names)]
            d.providers = ([0] if 0 in d.conns else []) + rest
        return d.providers

    # ------------------------------------------------------------------ recruiting

    def _start(self, d: Node) -> None:
        d.started = True
        d.last_peer_progress = self.sim.now
        d.recruit_phase = self.sim.now
        self._recruit(d)

    def _need_recruit(self, d: Node, earliest: float) -> None:
        """The recruit loop runs every RECRUIT_S; only a tick after a change can do anything."""
        k = max(0, math.ceil((earliest - d.recruit_phase) / sel.RECRUIT_S - 1e-9))
        t = d.recruit_phase + k * sel.RECRUIT_S
        if d.recruit_at is not None and self.sim.now <= d.recruit_at <= t:
            return
        d.recruit_at = t
        self.sim.at(t, self._recruit_tick, d, t)

    def _recruit_tick(self, d: Node, t: float) -> None:
        if d.recruit_at == t:
            d.recruit_at = None
            self._recruit(d)

    def _recruit(self, d: Node) -> None:
        if d.complete:
            return
        now = self.sim.now
        wake = math.inf
        for j in self._providers(d):
            if len(d.workers) >= self.cfg.limits.max_providers:
                break
            if j in d.workers:
                continue
            if d.retry_after.get(j, 0.0) > now:
                wake = min(wake, d.retry_after[j])
                continue
            w = Worker(d, self.nodes[j])
            d.workers[j] = w
            self._open(w)
        if wake < math.inf:
            self._need_recruit(d, wake)

    # ------------------------------------------------------------------ the worker loop

    def _open(self, w: Worker) -> None:
        w.gen += 1
        self.sim.after(self.lat, self._accept, w, w.gen)

    def _accept(self, w: Worker, gen: int) -> None:
        if gen != w.gen or not w.alive:
            return
        if w.p.serving >= self.cfg.limits.max_serving_streams:
            self.stats["serve.refused"] += 1
            self.sim.after(self.lat, self._stream_error, w, gen)
            return
        w.p.serving += 1
        w.open = True
        self.sim.after(self.lat, self._step, w, gen)

    def _step(self, w: Worker, gen: int) -> None:
        if gen != w.gen or not w.alive:
            return
        d, now = w.d, self.sim.now
        if w.bitmap is None and not w.pending:
            self._ask_have(w, gen, now)
            return
        depth = max(1, self.cfg.limits.pipeline_depth)
        while w.bitmap is not None and len(w.pending) < depth:
            i = sel.pick_chunk(
                w.p.idx, w.bitmap, d.have, d.inflight, d.busy, d.bitmaps, now, d.last_peer_progress, self.rng
            )
            if i is None:
                break
            d.inflight.add(i)
            w.pending.append(i)
            self.stats["gets"] += 1
            self.sim.after(self.lat, self._get_arrives, w, gen, i)
        if not w.pending:
            # idle: sleep, then refresh a partial holder's bitmap (the sleep and the HAVE round trip
            # are one event: the answer is what the provider held when the HAVE reached it)
            t = now + w.idle
            w.idle = min(w.idle * 2, sel.IDLE_MAX_S)
            if w.bitmap is not None and all(w.bitmap):
                self.sim.at(t, self._step, w, gen)
            else:
                w.bitmap = None
                self._ask_have(w, gen, t)
            return
        w.idle = sel.IDLE_MIN_S
        w.deadline = now + self.cfg.chunk_timeout_s
        if not w.timer:
            w.timer = True
            self.sim.at(w.deadline, self._timer, w)

    def _ask_have(self, w: Worker, gen: int, t: float) -> None:
        self.stats["haves"] += 1
        self.sim.at(t + 2 * self.lat, self._have_arrives, w, gen, t + self.lat)

    def _have_arrives(self, w: Worker, gen: int, t_answer: float) -> None:
        if gen != w.gen or not w.alive:
            return
        p = w.p
        if p.done_at is not None and p.done_at <= t_answer:
            snap: Any = self.all_true
        else:
            snap = [h <= t_answer for h in p.have_at]
        w.bitmap = snap
        w.d.bitmaps[p.idx] = snap
        self._step(w, gen)

    # ------------------------------------------------------------------ the provider's chunk server

    def _get_arrives(self, w: Worker, gen: int, i: int) -> None:
        if gen != w.gen or not w.alive:
            return
        w.queue.append(i)
        if not w.serving:
            self._serve_next(w, gen)

    def _serve_next(self, w: Worker, gen: int) -> None:
        p, now = w.p, self.sim.now
        while w.queue:
            i = w.queue.popleft()
            if p.complete:
                ok = not p.superseed or sel.may_upload_copy(
                    p.uploads, (BLOB, i), now, self.cfg.superseed_cooldown_s, in_flight=p.seeding
                )
                status = OK if ok else BUSY
            else:
                status = OK if p.have[i] else NOT_FOUND
            delay = 0.0
            if status == OK and p.pacer is not None:
                wait = p.pacer.reserve(self.clen(i), now)
                if wait is None:
                    self.stats["serve.rate_busy"] += 1
                    status = BUSY
                else:
                    delay = wait
            if status != OK:
                self.stats["busy" if status == BUSY else "not_found"] += 1
                self.sim.after(self.lat, self._response, w, gen, i, status)
                continue
            w.serving = True
            if delay > 0:
                self.sim.after(delay, self._send_chunk, w, gen, i)
            else:
                self._send_chunk(w, gen, i)
            return
        w.serving = False

    def _send_chunk(self, w: Worker, gen: int, i: int) -> None:
        if gen != w.gen or not w.alive:
            return
        w.seeding = w.p.complete and w.p.superseed
        w.p.seeding += w.seeding
        w.flow = self.links.start(w.p.idx, w.d.idx, self.clen(i), self._sent, w, gen, i)

    def _sent(self, w: Worker, gen: int, i: int) -> None:
        w.flow = None
        w.p.seeding -= w.seeding
        w.seeding = False
        self.sim.after(self.lat, self._response, w, gen, i, OK)
        self._serve_next(w, gen)

    # ------------------------------------------------------------------ responses and failures

    def _response(self, w: Worker, gen: int, i: int, status: int) -> None:
        if gen != w.gen or not w.alive:
            return
        d = w.d
        w.pending.popleft()
        d.inflight.discard(i)
        w.fails = 0
        w.deadline = math.inf
        if status == OK:
            if not d.have[i]:
                d.have[i] = True
                d.have_at[i] = self.sim.now
                d.count += 1
            d.last_peer_progress = self.sim.now
            if d.count == self.n:
                self._complete(d)
                return
        elif status == BUSY:
            d.busy[(w.p.idx, i)] = self.sim.now + sel.BUSY_RETRY_S
        else:
            w.bitmap = None
        self._step(w, gen)

    def _timer(self, w: Worker) -> None:
        """Timeout check: one per worker on the heap, moved on while responses keep coming."""
        w.timer = False
        if not w.alive or w.deadline == math.inf:
            return
        if self.sim.now < w.deadline:
            w.timer = True
            self.sim.at(w.deadline, self._timer, w)
            return
        self.stats["timeouts"] += 1
        self._stream_error(w, w.gen)

    def _close(self, w: Worker) -> None:
        w.gen += 1
        if w.flow is not None:
            self.links.cancel(w.flow)
            w.flow = None
        w.p.seeding -= w.seeding
        w.seeding = False
        w.queue.clear()
        w.serving = False
        if w.open:
            w.open = False
            w.p.serving -= 1

    def _stream_error(self, w: Worker, gen: int) -> None:
        if gen != w.gen or not w.alive:
            return
        d = w.d
        w.fails += 1
        for i in w.pending:
            d.inflight.discard(i)
        w.pending.clear()
        w.deadline = math.inf
        self._close(w)
        w.bitmap = None
        if w.fails >= FAILS_BEFORE_RETRY_AFTER:
            d.retry_after[w.p.idx] = self.sim.now + RETRY_AFTER_S
            self._retire(w)
            self._need_recruit(d, self.sim.now)
            return
        self.sim.after(0.1 * w.fails, self._open, w)

    def _retire(self, w: Worker) -> None:
        w.alive = False
        w.d.workers.pop(w.p.idx, None)
        w.d.bitmaps.pop(w.p.idx, None)

    def _complete(self, d: Node) -> None:
        d.complete = True
        d.done_at = self.sim.now
        self.remaining -= 1
        for w in list(d.workers.values()):
            for i in w.pending:
                d.inflight.discard(i)
            w.pending.clear()
            self._close(w)
            self._retire(w)
        d.busy.clear()
        d.retry_after.clear()
