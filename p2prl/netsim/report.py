"""Runs the swarm, the star and the relay tree on one simulated population and sums them up."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from p2prl.net import NetConfig
from p2prl.netsim.baselines import StarSim, TreeSim
from p2prl.netsim.population import Population, Spec, build
from p2prl.netsim.swarm import SwarmSim


def _quantile_time(done: list[float | None], q: float) -> float | None:
    """Seconds after publishing until a share ``q`` of the peers (trainer excluded) hold the patch."""
    times = sorted(t for t in done[1:] if t is not None)
    need = max(1, math.ceil(q * (len(done) - 1) - 1e-9))
    return round(times[need - 1], 3) if len(times) >= need else None


def summary(
    done: list[float | None], trainer_up: float, size: int, pop: Population, wall: float
) -> dict[str, Any]:
    nat_done = [t for i, t in enumerate(done) if i and pop.nat[i]]
    return {
        "trainer_upload_bytes": int(trainer_up),
        "trainer_upload_x": round(trainer_up / size, 3),
        "t50_s": _quantile_time(done, 0.5),
        "t90_s": _quantile_time(done, 0.9),
        "t100_s": _quantile_time(done, 1.0),
        "complete": sum(1 for t in done[1:] if t is not None),
        "nat_complete": sum(1 for t in nat_done if t is not None),
        "sim_wall_s": round(wall, 2),
    }


def run_swarm(
    spec: Spec, pop: Population, cooldown_s: float = 1.0, cap_mb_s: float = 0.0, provider_order: str = "node"
) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = SwarmSim(
        spec,
        pop,
        NetConfig(superseed=cooldown_s > 0, superseed_cooldown_s=cooldown_s or 1.0),
        cap_mb_s,
        provider_order,
    )
    s.run()
    done = [node.done_at for node in s.nodes]
    out = summary(done, s.links.bytes_up[0], spec.size, pop, time.perf_counter() - t0)
    out["events"] = s.sim.events
    out["counts"] = dict(sorted(s.stats.items()))
    return out


def run_all(
    spec: Spec,
    fanout: int = 4,
    cooldown_s: float = 1.0,
    cap_mb_s: float = 0.0,
    baselines: bool = True,
    provider_order: str = "node",
) -> dict[str, Any]:
    pop = build(spec)
    n = len(pop.up)
    mbit = [x * 8 / 1e6 for x in pop.up[1:]]
    res: dict[str, Any] = {
        "spec": dataclasses.asdict(spec),
        "blob_bytes": spec.size,
        "n_chunks": max(1, -(-spec.size // spec.chunk)),
        "nat_peers": sum(pop.nat[1:]),
        "peer_up_mbit_median": round(sorted(mbit)[len(mbit) // 2], 1) if mbit else None,
        "one_transfer_s": round(spec.size / min(pop.up[0], min(pop.down[1:], default=pop.up[0])), 3),
        "superseed_cooldown_s": cooldown_s,
        "provider_order": provider_order,
        "swarm": run_swarm(spec, pop, cooldown_s, cap_mb_s, provider_order),
    }
    if baselines:
        for name, cls, kw in (("star", StarSim, {}), ("tree", TreeSim, {"fanout": fanout})):
            t0 = time.perf_counter()
            b = cls(spec, pop, **kw)
            b.run()
            res[name] = summary(b.done_at, b.links.bytes_up[0], spec.size, pop, time.perf_counter() - t0)
        res["tree"]["fanout"] = fanout
    res["peers"] = n - 1
    return res
