"""The simulator against analytic cases, and the swarm's properties on simulated links."""

from __future__ import annotations

import pytest

from p2prl.net import selection
from p2prl.netsim.baselines import StarSim, TreeSim, tree_parents
from p2prl.netsim.population import MBIT, Spec, build
from p2prl.netsim.report import run_all, run_swarm
from p2prl.netsim.swarm import SwarmSim


def _star(spec: Spec) -> StarSim:
    s = StarSim(spec, build(spec))
    s.run()
    return s


def test_star_one_peer_takes_size_over_rate_plus_two_latencies() -> None:
    spec = Spec(peers=1, patch_mib=8, link_mbit=100, latency_s=0.02)
    s = _star(spec)
    start = s.pop.start[1]  # when the peer learnt of the patch
    assert s.done_at[1] == pytest.approx(start + spec.size / (100 * MBIT) + 2 * 0.02, rel=1e-9)


def test_star_n_equal_peers_share_the_publisher_uplink() -> None:
    spec = Spec(peers=10, patch_mib=4, link_mbit=0.0, up_mbit=(50.0, 50.0), trainer_mbit=100, latency_s=0.0)
    spec.nat_share = 0.0
    s = _star(spec)
    assert set(s.pop.start[1:]) == {0.0}
    # every peer's downlink (>= 50 Mbit/s) exceeds its 10 Mbit/s share: the publisher is the bottleneck
    assert max(s.done_at[1:]) == pytest.approx(10 * spec.size / (100 * MBIT), rel=1e-9)
    assert s.links.bytes_up[0] == 10 * spec.size


def test_tree_parents_keep_nated_peers_at_the_leaves_under_public_parents() -> None:
    pop = build(Spec(peers=200, nat_share=0.6, seed=3))
    parent = tree_parents(pop, 4)
    kids = {p for p in parent if p >= 0}
    assert not any(pop.nat[k] for k in kids)
    assert all(not pop.nat[parent[i]] for i in range(1, len(parent)))
    t = TreeSim(Spec(peers=200, nat_share=0.6, seed=3, patch_mib=2), pop)
    t.run()
    assert all(x is not None for x in t.done_at)


def test_nat_peers_are_only_connected_to_public_ones() -> None:
    pop = build(Spec(peers=150, nat_share=0.5, seed=5))
    for i, conns in enumerate(pop.conns):
        assert not (pop.nat[i] and any(pop.nat[j] for j in conns))
    assert all(0 in pop.conns[i] for i in range(1, len(pop.conns)))


def test_swarm_beats_star_and_everybody_finishes() -> None:
    res = run_all(Spec(peers=16, patch_mib=16, link_mbit=50, seed=2), cooldown_s=10.0)
    swarm, star = res["swarm"], res["star"]
    assert swarm["complete"] == star["complete"] == 16
    assert swarm["t100_s"] < star["t100_s"] / 3
    assert swarm["trainer_upload_x"] <= 1.5 < star["trainer_upload_x"]


def test_mixed_links_with_nat_everybody_finishes() -> None:
    res = run_all(Spec(peers=60, patch_mib=8, nat_share=0.5, seed=4), baselines=False)
    assert res["nat_peers"] > 10
    assert res["swarm"]["complete"] == 60
    assert res["swarm"]["nat_complete"] == res["nat_peers"]


def test_nated_peers_finish_when_the_trainer_is_the_only_public_peer() -> None:
    spec = Spec(peers=12, patch_mib=4, nat_share=1.0, seed=6)
    pop = build(spec)
    assert all(pop.nat[1:])
    res = run_swarm(spec, pop)
    assert res["complete"] == res["nat_complete"] == 12


def test_the_simulator_runs_the_live_chunk_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = selection.pick_chunk

    def counting(*args: object, **kw: object) -> int | None:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(selection, "pick_chunk", counting)
    res = run_swarm(Spec(peers=4, patch_mib=2, link_mbit=50), build(Spec(peers=4, patch_mib=2, link_mbit=50)))
    assert res["complete"] == 4
    assert len(calls) >= 2 * 4  # at least one pick per chunk per peer


def test_late_joiners_connect_and_finish_after_they_join() -> None:
    spec = Spec(peers=30, patch_mib=4, nat_share=0.3, join_spread_s=6.0, seed=8)
    pop = build(spec)
    assert max(pop.start) > 3.0
    s = SwarmSim(spec, pop)
    s.run()
    assert all(n.done_at is not None and n.done_at >= pop.start[n.idx] for n in s.nodes[1:])


def test_own_provider_orders_beat_lowest_id_first_past_max_providers() -> None:
    """24 peers > max_providers (16): with every downloader asking the lowest ids, chunks given to the
    others stay rare and wait for the trainer's next copy (the order the node used before)."""
    spec = Spec(peers=24, patch_mib=16, link_mbit=50, latency_s=0.025)
    by_id = run_swarm(spec, build(spec), 10.0, 0.0, "id")
    own = run_swarm(spec, build(spec), 10.0, 0.0, "node")
    assert own["complete"] == by_id["complete"] == 24
    assert own["t100_s"] < 0.75 * by_id["t100_s"], (own["t100_s"], by_id["t100_s"])
    assert own["trainer_upload_x"] <= by_id["trainer_upload_x"]
