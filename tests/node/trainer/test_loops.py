"""The trainer's learner and publisher loops on a running trainer node (its real host, the default
model): groups in the replay buffer become GRPO steps, each handed to the publisher as the newest
state, published as a signed delta that a node applies bit for bit; pausing stops publishing."""

from __future__ import annotations

import time

import torch

from p2prl.bench.trainer import synthetic_groups
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.learner import Mailbox
from p2prl.node.trainer.trainer import Trainer
from p2prl.patch import apply_patch, weights_hash
from p2prl.rl import unique_state


def _feed(trainer: Trainer, seed: int) -> None:
    vocab = int(trainer.grpo.model.config.vocab_size)
    groups = synthetic_groups(4, 4, 4, vocab, seed)
    with trainer.learner.buffer_lock:
        for g in groups:
            g.version = trainer.version
            trainer.learner.buffer.add(g)


def test_buffered_groups_are_trained_and_published_as_checked_deltas(make_net, wait_for) -> None:
    net = make_net(("trainer",))
    rt = build_runtime(net.config("trainer", min_publish_s=0.0))
    trainer = Trainer(rt.env(TrainerSettings))
    try:
        rt.start(trainer)
        wait_for(lambda: trainer.chain.version == 0, 60, "the genesis anchor")
        v0 = {k: v.clone() for k, v in trainer.chain.state.items()}
        for v, seed in ((1, 1), (2, 2)):  # a step consumes what it samples
            _feed(trainer, seed)
            wait_for(lambda v=v: trainer.version >= v, 60, f"trained version {v}")
        trainer.pause()
        time.sleep(0.5)  # a step already handed over may still publish
        held = trainer.version
        counters = rt.status.snapshot()["counters"]
        assert counters["train_steps"] >= 2 and counters["versions_published"] >= 3
        # each delta the publisher signed takes the last version to the next, bit for bit
        state = v0
        for v in range(1, held + 1):
            m = trainer.chain.manifests.get(v)
            assert m is not None and m.kind == "delta" and m.base_version == v - 1
            state = apply_patch(state, rt.store.get(m.blob.id), base_hash=m.base_hash)
            assert weights_hash(state) == m.result_hash
        assert weights_hash(state) == trainer.chain.result_hash
        _feed(trainer, 3)
        time.sleep(1.0)
        assert trainer.version == held, "a paused trainer published"
        trained = unique_state(trainer.grpo.model)
        assert any(not torch.equal(trained[k], v0[k].to(trained[k].dtype)) for k in v0 if k in trained)
    finally:
        rt.stop.set()
        rt.join(30)
        rt.net.stop()


def test_a_newer_state_replaces_one_the_publisher_has_not_taken() -> None:
    box: Mailbox[int] = Mailbox()
    assert box.empty and box.take(timeout=0.01) is None
    box.put(1)
    box.put(2)
    assert not box.empty
    assert box.take(timeout=0.01) == 2 and box.empty
