"""One copy of the weights: patches verified, then applied into the engine model's own tensors."""

from __future__ import annotations

import pytest
import torch
from weightskit import bits_equal, forged, perturb, snapshot

from p2prl.crypto.keys import Identity
from p2prl.node.weights.live import LiveWeights
from p2prl.node.weights.version import Weights
from p2prl.patch import encode_patch
from p2prl.patch.chain import ChainPublisher, plan_sync
from p2prl.patch.dtypes import uint_view
from p2prl.patch.errors import PatchError
from p2prl.patch.hashing import weights_hash
from p2prl.patch.manifests import ManifestStore
from p2prl.protocol.blobs import MIN_CHUNK_SIZE, blob_ref_for
from p2prl.rl.model import unique_state
from p2prl.store import BlobStore

NET = "livenet"
TRAINER = Identity(b"\x05" * 32)


def _model(model_dir):
    from p2prl.rl.modeldir import load_weights_model

    return load_weights_model(model_dir, torch.bfloat16)


def _trainer_chain(tmp_path, base, n):
    """The trainer's side: ``n`` versions after ``base`` (a few % of every tensor changes each)."""
    pub = ChainPublisher(tmp_path / "trainer", TRAINER, NET, chunk_size=MIN_CHUNK_SIZE, anchor_interval=100)
    states, published = [snapshot(base)], []
    published.append(pub.publish(states[0]))
    for i in range(n):
        states.append(perturb(states[-1], 0.05, seed=i + 3))
        published.append(pub.publish(states[-1]))
    return pub, states, published


def _receiver(tmp_path, published):
    store = BlobStore(tmp_path / "node")
    index = ManifestStore(NET, TRAINER.public_key)
    for pv in published:
        for p in pv.items:
            index.add(p.envelope)
            store.put(p.blob, expected_id=p.manifest.blob.id)
    return store, index


@pytest.mark.parametrize("split", [None, 1])
def test_in_place_bit_identical_to_the_trainer_and_steps_back(tmp_path, model_dir, monkeypatch, split):
    """``split``: the swap's scatter split over threads from one element on (a large switch's path)."""
    import p2prl.patch.scatter as scatter_mod

    if split is not None:
        monkeypatch.setattr(scatter_mod, "SPLIT_ELEMENTS", split)
        monkeypatch.setattr(scatter_mod, "SCATTER_THREADS", 3)
    model = _model(model_dir)
    state = unique_state(model)
    ptrs = {k: v.data_ptr() for k, v in state.items()}
    assert (
        "lm_head.weight" not in state
        and model.lm_head.weight.data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    )
    pub, states, published = _trainer_chain(tmp_path, state, 3)
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=3)
    live.advance(plan_sync(0, live.hash, index, 1), store.get)
    live.advance(plan_sync(1, live.hash, index, 3), store.get)  # two deltas in one switch
    assert live.head == 3 and live.hash == pub.result_hash
    now = unique_state(model)
    assert {k: v.data_ptr() for k, v in now.items()} == ptrs  # the model's own tensors, patched in place
    assert bits_equal(now, states[3]) and weights_hash(now) == pub.result_hash
    live.goto(1)  # a validator checking a batch two versions old
    assert bits_equal(unique_state(model), states[1]) and live.weights(1).hash == index.get(1).result_hash
    assert not live.reachable(0)
    with pytest.raises(KeyError):
        live.goto(0)
    live.goto(3)
    assert bits_equal(unique_state(model), states[3])


def test_a_bad_patch_leaves_the_model_unchanged(tmp_path, model_dir):
    model = _model(model_dir)
    state = unique_state(model)
    pub, states, published = _trainer_chain(tmp_path, state, 1)
    store, index = _receiver(tmp_path, published)
    good = index.get(1, "delta")
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=2)
    before = snapshot(state)
    # a well-formed patch of other weights under the manifest's promise; a corrupted one; a truncated one
    other = encode_patch(states[0], perturb(states[0], 0.05, seed=99))
    blob = pub.store.get(good.blob.id)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x40
    for bad in (other, bytes(flipped), blob[: len(blob) // 2]):
        ref = blob_ref_for(bad, MIN_CHUNK_SIZE)
        store.put(bad, expected_id=ref.id)
        m = type(good)(**{**good.__dict__, "blob": ref})
        with pytest.raises(PatchError):
            live.advance([m], store.get)
        assert (
            bits_equal(unique_state(model), before) and live.head == 0 and live.hash == weights_hash(before)
        )
    live.advance([good], store.get)  # and the good one still applies
    assert bits_equal(unique_state(model), states[1])


def test_tracked_switches_name_exactly_the_tensors_they_wrote(tmp_path, model_dir):
    """An engine with its own copy (vLLM) is sent only what each switch changed."""
    model = _model(model_dir)
    state = unique_state(model)
    base = snapshot(state)
    pub = ChainPublisher(tmp_path / "trainer", TRAINER, NET, chunk_size=MIN_CHUNK_SIZE, anchor_interval=100)
    published = [pub.publish(base)]
    v1 = snapshot(base)
    touched = sorted(v1)[:3]
    for n in touched:
        uint_view(v1[n])[:5] ^= 1
    published.append(pub.publish(v1))
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=1)
    assert live.take_changed() == set(state)  # untracked: an engine must take everything
    live.track_changes()
    assert live.take_changed() == set(state)  # the first take after tracking starts: everything
    assert live.take_changed() == set()
    live.advance(plan_sync(0, live.hash, index, 1), store.get)
    assert live.take_changed() == set(touched) and live.take_changed() == set()
    assert bits_equal(unique_state(model), v1)


def test_prepared_switch_writes_only_the_changes_into_an_engine_with_its_own_copy(tmp_path, model_dir):
    """The CUDA shape on the CPU: the node's live copy is checked beside generation (prepare), the swap
    writes the recorded changes, and the engine's own model gets the switch as a value (positions and
    values through ``scatter_into``): both end bit-identical to the trainer, chained switches too."""
    from p2prl.rl.engine import HFEngine

    engine_model = _model(model_dir)
    state = snapshot(unique_state(engine_model))  # apart from the engine's tensors, as on CUDA
    pub, states, published = _trainer_chain(tmp_path, state, 3)
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=2)
    engine = HFEngine(engine_model, tokenizer=None)
    ready = live.prepare(plan_sync(0, live.hash, index, 1), store.get)
    assert ready is not None and bits_equal(state, states[0])  # checked, not written
    w = live.advance(plan_sync(0, live.hash, index, 1), store.get, ready)
    assert w.switch is not None and (w.switch.base, w.switch.version, w.switch.hash) == (0, 1, w.hash)
    written = engine.write_changes((x.name, x.start, x.positions, x.values) for x in w.switch.writes)
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert 0 < written < total / 4  # a few % changed: the changed elements, not the model
    assert bits_equal(state, states[1]) and bits_equal(unique_state(engine_model), states[1])
    # two deltas in one switch (not prepared: a chain is checked on the role's thread): one value
    w = live.advance(plan_sync(1, live.hash, index, 3), store.get)
    assert w.switch is not None and (w.switch.base, w.switch.version) == (1, 3)
    engine.write_changes((x.name, x.start, x.positions, x.values) for x in w.switch.writes)
    assert bits_equal(unique_state(engine_model), states[3]) and weights_hash(state) == pub.result_hash


def test_a_prepared_check_is_redone_once_the_weights_moved_and_a_bad_patch_fails_in_prepare(tmp_path, model_dir):
    model = _model(model_dir)
    state = unique_state(model)
    pub, states, published = _trainer_chain(tmp_path, state, 2)
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=1)
    good = index.get(1, "delta")
    other = encode_patch(states[0], perturb(states[0], 0.05, seed=99))  # promises another result
    ref = blob_ref_for(other, MIN_CHUNK_SIZE)
    store.put(other, expected_id=ref.id)
    with pytest.raises(PatchError) as e:
        live.prepare([type(good)(**{**good.__dict__, "blob": ref})], store.get)
    assert e.value.reason == "hash_mismatch" and bits_equal(unique_state(model), states[0])
    stale = live.prepare([good], store.get)
    live.advance([good], store.get)  # the role switched on its own meanwhile
    assert live.prepare([index.get(2, "delta")], store.get) is not None
    assert live.prepare([good], store.get) is None  # not a delta from the head any more
    live.advance([index.get(2, "delta")], store.get, stale)  # a stale check is not used: checked again
    assert bits_equal(unique_state(model), states[2]) and live.hash == pub.result_hash


def test_a_switch_before_its_hash_is_confirmed_or_stepped_back(tmp_path, model_dir):
    """A miner's switch: the signed patch decoded, written, then the live weights hashed (confirm); a
    patch that decodes but does not produce the result it promises is stepped back bit for bit."""
    model = _model(model_dir)
    state = unique_state(model)
    pub, states, published = _trainer_chain(tmp_path, state, 2)
    store, index = _receiver(tmp_path, published)
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=1)
    good1, good2 = index.get(1, "delta"), index.get(2, "delta")
    ready = live.prepare([good1], store.get, deferred=True)
    assert ready is not None and not ready.hashed and bits_equal(state, states[0])
    live.advance([good1], store.get, ready)
    assert live.unconfirmed == 1 and bits_equal(unique_state(model), states[1])
    with pytest.raises(PatchError):  # nothing switches on from a version not yet confirmed
        live.advance([good2], store.get)
    assert live.confirm() and live.unconfirmed is None and live.hash == good1.result_hash
    assert live.confirm()  # nothing left to confirm
    bad = forged(store, good2, states[1], seed=98)
    with pytest.raises(PatchError) as e:  # hashed before the switch, it never writes
        live.prepare([bad], store.get)
    assert e.value.reason == "hash_mismatch" and bits_equal(unique_state(model), states[1])
    ready = live.prepare([bad], store.get, deferred=True)  # decoded only: it passes
    assert ready is not None
    live.advance([bad], store.get, ready)
    assert live.unconfirmed == 2 and not bits_equal(unique_state(model), states[1])
    assert not live.confirm()
    assert live.unconfirmed is None and live.head == 1 and live.hash == good1.result_hash
    assert bits_equal(unique_state(model), states[1])
    live.advance([good2], store.get)  # and the good one still applies
    assert bits_equal(unique_state(model), states[2]) and live.hash == pub.result_hash


def test_a_deferred_switch_hands_the_engine_the_values_and_writes_the_live_copy_at_confirm(tmp_path, model_dir):
    """On CUDA the engine's own copy takes the switch's positions and values during the pause; the
    node's live copy is written by confirm, beside generation (dense segments too: 60% changed)."""
    from p2prl.rl.engine import HFEngine

    engine_model = _model(model_dir)
    state = snapshot(unique_state(engine_model))
    pub = ChainPublisher(tmp_path / "trainer", TRAINER, NET, chunk_size=MIN_CHUNK_SIZE, anchor_interval=100)
    states = [snapshot(state), perturb(state, 0.6, seed=4)]
    store, index = _receiver(tmp_path, [pub.publish(s) for s in states])
    live = LiveWeights(state, Weights(0, weights_hash(state), state), keep=1)
    m = index.get(1, "delta")
    w = live.advance([m], store.get, live.prepare([m], store.get, deferred=True), write_later=True)
    assert w.switch is not None and any(x.positions is None for x in w.switch.writes)  # dense segments
    assert bits_equal(state, states[0])  # the live copy waits for confirm
    HFEngine(engine_model, tokenizer=None).write_changes((x.name, x.start, x.positions, x.values) for x in w.switch.writes)
    assert bits_equal(unique_state(engine_model), states[1])
    assert live.confirm() and bits_equal(state, states[1]) and live.hash == pub.result_hash
