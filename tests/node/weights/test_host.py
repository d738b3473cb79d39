"""The host of a miner's or validator's weights: switches applied on the role's thread, the engine
written or loaded, the saved copy, what the sync hears."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_live import _model, _receiver, _trainer_chain, bits_equal, snapshot

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


def test_a_miners_host_switches_the_tensors_and_writes_one_switch_into_its_engine(
    tmp_path, model_dir
) -> None:
    """Two staged versions, one switch: the live tensors, the engine (its own copy, as on CUDA), the
    saved copy and the status all at the newest; the sync hears of it once."""
    engine_model = _model(model_dir)
    state = snapshot(unique_state(engine_model))  # apart from the engine's tensors, as on CUDA
    pub, states, published = _trainer_chain(tmp_path, state, 2)
    store, index = _receiver(tmp_path, published)
    env = _env(store)
    live = LiveWeights(state, Weights(0, weights_hash(state), state))
    host = ModelHost(env, live, HFEngine(engine_model, tokenizer=None), tmp_path / "weights", follow=True)
    heard: list[tuple[list[int], Exception | None]] = []
    host.listen(lambda done, error: heard.append(([w.version for w in done], error)))
    assert host.switch() == [] and heard == []
    host.stage(_staged(index, store, host, 0, 1, prepare=True))
    host.stage(_staged(index, store, host, 1, 2, prepare=False))
    assert host.base().version == 2 and host.current.version == 0 and host.has_staged()
    done = host.switch()
    assert [w.version for w in done] == [1, 2] and heard == [([1, 2], None)]
    assert host.current.version == 2 and host.current.hash == pub.result_hash and not host.has_staged()
    assert bits_equal(state, states[2]) and bits_equal(unique_state(engine_model), states[2])
    snap = env.status.snapshot()
    assert snap["version"] == 2 and snap["weights_hash"] == pub.result_hash
    assert snap["gauges"]["engine_write_bytes"] > 0  # the changed elements only, in one switch
    saved = load_saved_weights(tmp_path / "weights")
    assert saved is not None and saved.version == 2 and bits_equal(saved.state, states[2])


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
