"""The host of a miner's or validator's weights: switches applied on the role's thread, the engine
written or loaded, the saved copy, what the sync hears."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_live import _model, _receiver, _trainer_chain
from weightskit import bits_equal, forged, snapshot

from p2prl.node.runtime.status import NodeStatus
from p2prl.node.weights.disk import load_saved_weights
from p2prl.node.weights.host import ModelHost, Staged
from p2prl.node.weights.live import LiveWeights
from p2prl.node.weights.version import Weights
from p2prl.patch.chain import plan_sync
from p2prl.patch.errors import PatchError
from p2prl.patch.hashing import weights_hash
from p2prl.rl.engine import HFEngine
from p2prl.rl.model import unique_state
from p2prl.store import BlobStore

NET = "livenet"


def test_a_switch_is_written_into_an_engine_only_when_it_holds_its_own_copy() -> None:
    """On the CPU the live tensors are the engine's own (nothing to write after a switch); on CUDA,
    or with ``share_weights=False``, they are apart and the switch's writes go to the engine."""
    import torch

    from p2prl.node.weights.host import _shares

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    state = unique_state(model)
    assert _shares(model, state)
    assert not _shares(model, {k: v.clone() for k, v in state.items()})
    assert not _shares(model, {**state, "0.weight": state["0.weight"].clone()})


def _env(store: BlobStore) -> Any:
    """The part of a RoleEnv the host uses: status, store, settings."""
    return SimpleNamespace(
        status=NodeStatus("miner", "ab" * 32, NET),
        store=store,
        settings=SimpleNamespace(report_weights_sha256=False),
    )


def _staged(index: Any, store: BlobStore, host: ModelHost, base: int, version: int, prepare: bool) -> Staged:
    """What the sync thread hands the host: the plan to ``version`` from ``base``, checked if asked."""
    plan = plan_sync(base, host.base().hash, index, version)
    m = plan[-1]
    return Staged(m.version, m.result_hash, plan, host.prepare(plan, store.get) if prepare else None)


def _miners_host(tmp_path: Any, model_dir: Any) -> SimpleNamespace:
    """A miner's host over an engine with its own copy (as on CUDA), a trainer's chain of two
    versions in its store, and what the sync hears."""
    engine_model = _model(model_dir)
    state = snapshot(unique_state(engine_model))  # apart from the engine's tensors, as on CUDA
    pub, states, published = _trainer_chain(tmp_path, state, 2)
    store, index = _receiver(tmp_path, published)
    env = _env(store)
    live = LiveWeights(state, Weights(0, weights_hash(state), state))
    host = ModelHost(env, live, HFEngine(engine_model, tokenizer=None), tmp_path / "weights", follow=True)
    heard: list[tuple[list[int], Exception | None]] = []
    host.listen(lambda done, error: heard.append(([w.version for w in done], error)))
    return SimpleNamespace(
        engine_model=engine_model, state=state, pub=pub, states=states, store=store, index=index,
        env=env, live=live, host=host, heard=heard,
    )


def test_a_miners_host_switches_the_tensors_and_writes_one_switch_into_its_engine(
    tmp_path, model_dir
) -> None:
    """Two staged versions, one switch: the live tensors, the engine (its own copy, as on CUDA), the
    saved copy and the status all at the newest; the sync hears of it once."""
    m = _miners_host(tmp_path, model_dir)
    assert m.host.switch() == [] and m.heard == []
    m.host.stage(_staged(m.index, m.store, m.host, 0, 1, prepare=True))
    m.host.stage(_staged(m.index, m.store, m.host, 1, 2, prepare=False))
    assert m.host.base().version == 2 and m.host.current.version == 0 and m.host.has_staged()
    done = m.host.switch()
    assert [w.version for w in done] == [1, 2] and m.heard == [([1, 2], None)]
    assert m.host.current.version == 2 and m.host.current.hash == m.pub.result_hash and not m.host.has_staged()
    assert bits_equal(m.state, m.states[2]) and bits_equal(unique_state(m.engine_model), m.states[2])
    snap = m.env.status.snapshot()
    assert snap["version"] == 2 and snap["weights_hash"] == m.pub.result_hash
    assert snap["gauges"]["engine_write_bytes"] > 0  # the changed elements only, in one switch
    saved = load_saved_weights(tmp_path / "weights")
    assert saved is not None and saved.version == 2 and bits_equal(saved.state, m.states[2])


def test_a_validators_host_loads_an_older_version_on_demand_and_a_bad_switch_is_reported(
    tmp_path, model_dir
) -> None:
    model = _model(model_dir)
    state = unique_state(model)  # the engine's own tensors, as on the CPU
    _, states, published = _trainer_chain(tmp_path, state, 2)
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=3)
    host = ModelHost(_env(store), live, HFEngine(model, tokenizer=None), tmp_path / "w", follow=False)
    heard: list[tuple[list[int], Exception | None]] = []
    host.listen(lambda done, error: heard.append(([w.version for w in done], error)))
    host.stage(_staged(index, store, host, 0, 1, prepare=True))
    host.stage(_staged(index, store, host, 1, 2, prepare=True))  # checked against v0: checked again
    assert [w.version for w in host.switch()] == [1, 2]
    got = host.source(1)
    assert got is not None and got[0] == published[1].result_hash and got[1] is model
    assert bits_equal(state, states[1])
    assert host.source(7) is None and host.current.version == 2  # never held
    assert host.can_load(0) and host.can_load(1) and not host.can_load(7)
    wrong = index.get(2, "delta")
    host.stage(Staged(3, "ee" * 32, [wrong], None))  # a plan that starts at another version
    assert host.switch() == [] and heard[-1][0] == [] and isinstance(heard[-1][1], PatchError)
    assert host.current.version == 2 and bits_equal(state, states[2])


def test_a_miners_host_holds_back_work_until_the_version_hashes_and_steps_back_when_it_does_not(
    tmp_path, model_dir
) -> None:
    """A miner switches once the signed patch is decoded; its confirm thread hashes the result. A
    version that hashes may send what was made with it; one that does not is stepped back — tensors,
    engine (its own copy) and current version — its work held back, the sync told."""
    m = _miners_host(tmp_path, model_dir)
    m.host.stage(_staged(m.index, m.store, m.host, 0, 1, prepare=True))
    assert [w.version for w in m.host.switch()] == [1]
    w1 = m.host.current
    assert m.host.settled(w1) and m.live.unconfirmed is None and bits_equal(m.state, m.states[1])
    assert bits_equal(unique_state(m.engine_model), m.states[1])
    bad = forged(m.store, m.index.get(2, "delta"), m.states[1], seed=98)
    m.host.stage(Staged(2, bad.result_hash, [bad], m.host.prepare([bad], m.store.get)))
    assert [w.version for w in m.host.switch()] == [2]  # switched before the hash
    w2 = m.host.current
    assert not m.host.settled(w2) and m.host.settled(w1)
    assert m.host.current.version == 1 and m.host.current.hash == w1.hash and m.live.head == 1
    assert bits_equal(m.state, m.states[1]) and bits_equal(unique_state(m.engine_model), m.states[1])
    assert m.heard[-1][0] == [] and isinstance(m.heard[-1][1], PatchError)
    snap = m.env.status.snapshot()
    assert snap["version"] == 1 and snap["weights_hash"] == w1.hash
    m.host.stage(_staged(m.index, m.store, m.host, 1, 2, prepare=True))  # the good version 2 still applies
    assert [w.version for w in m.host.switch()] == [2] and m.host.settled(m.host.current)
    assert bits_equal(unique_state(m.engine_model), m.states[2]) and m.host.current.hash == m.pub.result_hash
    m.host.close()
