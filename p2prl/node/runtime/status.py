"""A node's live status: one thread-safe record that feeds both the JSON status and Prometheus metrics.

Roles write into :class:`NodeStatus` (counters, gauges, bounded per-version series); the HTTP
endpoint (:mod:`p2prl.node.runtime.http`) serves ``snapshot()`` as JSON and the same numbers as Prometheus
metrics, so the dashboard and a scraper never disagree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from p2prl.lru import LRU
from p2prl.node.runtime.metrics import METRICS, Kind, declared

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

MAX_SERIES = 256  # versions kept in per-version series (hashes)
MAX_REWARD_SERIES = 2048  # versions kept in the reward series (its first versions matter to a summary)
MAX_LABELS = 64  # distinct reasons / miners kept in labelled counters


class Info(TypedDict, total=False):
    """The named facts roles report with :meth:`NodeStatus.set` (the first eleven are always there)."""

    role: str
    key: str
    network_id: str
    peer_id: str
    addrs: list[str]
    version: int
    weights_hash: str
    trainer_version: int
    sync_state: str
    peers: int
    buffer_groups: int
    train_batch_groups: int  # trainer: the groups one step takes
    stepping: bool  # trainer: a GRPO step is running now
    paused: bool
    task: str
    task_source: str  # module:class of the task plugin
    engine: str
    engine_weights_hash: str
    weights_sha256: str
    sha256_by_version: dict[str, str]
    calibrating: bool  # validator: judging with the genesis's tolerances until its own are calibrated
    judging: str  # validator: "keeping up", or how far behind its judging queue is


class RewardPoint(TypedDict):
    mean: float
    count: int


class Snapshot(Info):
    """``GET /status``: the facts, then the numbers (the same ones the metrics serve)."""

    lag: int
    uptime_s: float
    counters: dict[str, int]
    labelled: dict[str, dict[str, int]]
    gauges: dict[str, float]
    scores: dict[str, int]
    reward_by_version: dict[str, RewardPoint]
    hashes: dict[str, str]
    transfers: dict[str, dict[str, int]]


class NodeStatus:
    """Everything a node reports about itself; every method is safe to call from any thread."""

    def __init__(self, role: str, key: str, network_id: str) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self._info: Info = {
            "role": role,
            "key": key,
            "network_id": network_id,
            "peer_id": "",
            "addrs": [],
            "version": 0,
            "weights_hash": "",
            "trainer_version": 0,
            "sync_state": "starting",
            "peers": 0,
            "buffer_groups": 0,
        }
        self._counters: dict[str, int] = {}
        self._labelled: dict[str, dict[str, int]] = {}  # e.g. rejected{reason}, dropped{reason}
        self._gauges: dict[str, float] = {}
        self._scores: dict[str, int] = {}
        self._reward: OrderedDict[int, list[float]] = OrderedDict()  # version -> [sum, count]
        self._hashes: LRU[int, str] = LRU(MAX_SERIES)  # version -> weights hash (trainer)
        self._transfers: dict[str, dict[str, int]] = {}

    # -- writers ---------------------------------------------------------
    def set(self, **kw: Unpack[Info]) -> None:
        with self._lock:
            self._info.update(kw)

    def _declared(self, name: str, kind: Kind) -> bool:
        """False (and the write counted as ``undeclared_metric{name}``) for a name p2prl.node.runtime.metrics
        does not declare as ``kind``: a typo never starts a new series."""
        if declared(name, kind):
            return True
        with self._lock:
            first = f"{kind}:{name}" not in self._labelled.get("undeclared_metric", {})
        if first:
            log.error(
                "metric %r is not declared as a %s in p2prl.node.runtime.metrics; not recorded", name, kind
            )
        self.incr_label("undeclared_metric", f"{kind}:{name}")
        return False

    def incr(self, name: str, n: int = 1) -> None:
        if not self._declared(name, Kind.COUNTER):
            return
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def incr_label(self, name: str, label: str, n: int = 1) -> None:
        """Count by label (a rejection reason, a drop reason); the number of labels is bounded."""
        if not self._declared(name, Kind.LABELLED):
            return
        with self._lock:
            d = self._labelled.setdefault(name, {})
            if label not in d and len(d) >= MAX_LABELS:
                label = "other"
            d[label] = d.get(label, 0) + n

    def gauge(self, name: str, value: float) -> None:
        if not self._declared(name, Kind.GAUGE):
            return
        with self._lock:
            self._gauges[name] = float(value)

    def gauge_max(self, name: str, value: float) -> None:
        """A gauge that only rises: the worst value seen (a validator's largest honest errors)."""
        if not self._declared(name, Kind.GAUGE):
            return
        with self._lock:
            self._gauges[name] = max(self._gauges.get(name, float("-inf")), float(value))

    def set_scores(self, scores: dict[str, int]) -> None:
        with self._lock:
            self._scores = dict(list(scores.items())[: MAX_LABELS * 64])

    def add_reward(self, version: int, total: float, count: int) -> None:
        """Record ``count`` rewards summing to ``total`` for rollouts made at ``version``."""
        if count <= 0:
            return
        with self._lock:
            s = self._reward.setdefault(version, [0.0, 0])
            s[0] += total
            s[1] += count
            self._reward = OrderedDict(sorted(self._reward.items()))
            while len(self._reward) > MAX_REWARD_SERIES:
                self._reward.popitem(last=False)

    def record_hash(self, version: int, weights_hash: str) -> None:
        with self._lock:
            self._hashes[version] = weights_hash

    def transfer(self, blob_id: str, done: int, total: int) -> None:
        """Progress of a running transfer; ``done >= total`` removes it."""
        with self._lock:
            if done >= total:
                self._transfers.pop(blob_id, None)
            elif blob_id in self._transfers or len(self._transfers) < MAX_LABELS:
                self._transfers[blob_id] = {"done": int(done), "total": int(total)}

    # -- readers ---------------------------------------------------------
    def get(self, name: str, default: Any = None) -> Any:  # Any: an Info value or a counter, by name
        with self._lock:
            info: Mapping[str, object] = self._info
            if name in info:
                return info[name]
            return self._counters.get(name, default)

    def counter(self, name: str) -> int:
        with self._lock:
            return self._counters.get(name, 0)

    def snapshot(self) -> Snapshot:
        with self._lock:
            info = self._info
            return {
                **info,
                "lag": max(0, int(info["trainer_version"]) - int(info["version"])),
                "uptime_s": round(time.time() - self.started, 1),
                "counters": dict(self._counters),
                "labelled": {k: dict(v) for k, v in self._labelled.items()},
                "gauges": dict(self._gauges),
                "scores": dict(self._scores),
                "reward_by_version": {
                    str(v): {"mean": s[0] / s[1], "count": int(s[1])} for v, s in self._reward.items()
                },
                "hashes": {str(v): h for v, h in self._hashes.items()},
                "transfers": {k: dict(v) for k, v in self._transfers.items()},
            }


class StatusCollector:
    """Prometheus collector over a NodeStatus (registered in a per-node registry)."""

    def __init__(self, status: NodeStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.status.snapshot()
        labels = ["role", "key"]
        base = [s["role"], s["key"][:16]]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"p2prl_{name}", doc, labels=labels)
            g.add_metric(base, float(value))
            return g

        yield gauge("version", "Weights version this node serves/trains.", s["version"])
        yield gauge("trainer_version", "Newest trainer version this node has seen.", s["trainer_version"])
        yield gauge("sync_lag_versions", "Trainer version minus own version.", s["lag"])
        yield gauge("peers", "Connected libp2p peers.", s["peers"])
        yield gauge("uptime_seconds", "Seconds since the node started.", s["uptime_s"])
        yield gauge("buffer_groups", "Rollout groups in the trainer's replay buffer.", s["buffer_groups"])
        for name, value in sorted(s["gauges"].items()):
            yield gauge(name, METRICS[name].help, value)
        for name, value in sorted(s["counters"].items()):
            c = CounterMetricFamily(f"p2prl_{name}", METRICS[name].help, labels=labels)
            c.add_metric(base, float(value))
            yield c
        for name, by in sorted(s["labelled"].items()):
            c = CounterMetricFamily(f"p2prl_{name}", METRICS[name].help, labels=[*labels, "reason"])
            for reason, value in sorted(by.items()):
                c.add_metric([*base, reason], float(value))
            yield c
        sc = GaugeMetricFamily("p2prl_miner_score", "Per-miner score (validator window).", labels=["miner"])
        for miner, value in sorted(s["scores"].items()):
            sc.add_metric([miner[:16]], float(value))
        yield sc
        rw = GaugeMetricFamily(
            "p2prl_reward_mean", "Mean task reward of the newest version with rollouts.", labels=labels
        )
        if s["reward_by_version"]:
            last = max(s["reward_by_version"], key=int)
            rw.add_metric(base, s["reward_by_version"][last]["mean"])
        yield rw


def make_registry(status: NodeStatus) -> CollectorRegistry:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatusCollector(status))  # type: ignore[arg-type]
    return reg
