"""The miner's loop on an in-process network (the node's port without sockets; the default model):
it syncs the trainer's genesis anchor, mines batches under its quota, serves and announces them,
the trainer's intake takes the announcements in and receipts them, and the miner's next batches
follow those receipts."""

from __future__ import annotations

from localnet import LocalHub

from p2prl.node.miner.chains import Chains
from p2prl.node.miner.miner import Miner
from p2prl.node.setup.genesis import read_genesis
from p2prl.node.setup.settings import MinerSettings, TrainerSettings
from p2prl.node.trainer.trainer import Trainer


def test_a_miner_syncs_mines_and_announces_to_the_trainer(make_net, wait_for) -> None:
    net = make_net(("trainer", "miner1"))
    hub = LocalHub(read_genesis(net.genesis))
    trt = hub.runtime("trainer", net.ids["trainer"], net.root / "trainer")
    mrt = hub.runtime("miner", net.ids["miner1"], net.root / "miner1")
    trainer = Trainer(trt.env(TrainerSettings))
    try:
        trt.start(trainer)
        wait_for(lambda: trainer.chain.version == 0, 60, "the genesis anchor")
        miner = Miner(mrt.env(MinerSettings))
        mrt.start(miner)
        wait_for(lambda: mrt.status.snapshot()["counters"].get("batches_announced", 0) >= 2, 90, "two batches")
        snap = mrt.status.snapshot()
        assert snap["counters"]["rollouts_produced"] >= 2 * snap["counters"]["groups_produced"] > 0
        assert snap.get("version") == 0
        # the trainer heard them (it waits for a validator's verdict before it fetches any)
        miner_hex = net.ids["miner1"].public_hex

        def held() -> int:
            with trainer.intake.lock:
                return len(trainer.intake.policy.by_signer.get(miner_hex, {}))

        wait_for(lambda: held() >= 2, 30, "the trainer holding the miner's announcements")
        # the trainer receipts them every second; the miner's next batch follows its first receipt
        # (seeded by the list's digest and the receipted blob): the miner's first batch is its chain start
        wait_for(
            lambda: mrt.status.snapshot()["labelled"].get("batches", {}).get("chained", 0) >= 1, 90, "a chained batch"
        )
        assert mrt.status.snapshot()["labelled"]["batches"]["chain_start"] >= 1
        assert trt.status.snapshot()["counters"]["receipts_sent"] >= 1
        with trainer.intake.lock:
            anns = [h.ann for h in trainer.intake.policy.held.values() if h.miner == miner_hex]
        chained = [a for a in anns if a.chained]
        assert chained and {a.prev for a in chained} <= {a.blob.id for a in anns}
    finally:
        for rt in (mrt, trt):
            rt.stop.set()
        for rt in (mrt, trt):
            rt.join(30)
    # what a restart goes on with: the receipts in hand and the batches still waiting for one
    kept = Chains(net.ids["miner1"].public_key, miner.dir / "chains.json")
    assert kept.path is not None and kept.path.exists()
    assert len(kept) == len(miner.chains) and kept._waiting == miner.chains._waiting
    # and the trainer's side: a trainer started again on its directory knows the receipts it sent
    sent = trainer.intake.receipts.sent()
    assert len(sent) >= 1
    assert Trainer(trt.env(TrainerSettings)).intake.receipts.sent() == sent


def test_a_batch_made_with_a_version_that_does_not_hash_is_never_announced(make_net, tmp_path) -> None:
    """A miner switches before the hash of the new weights is in; a batch made meanwhile with a version
    whose result is not what its manifest promised is dropped, not announced, and the miner is back at
    the version before (its tensors bit for bit)."""
    from weightskit import bits_equal, forged, perturb, snapshot

    from p2prl.crypto.keys import Identity
    from p2prl.node.weights.host import Staged
    from p2prl.patch.chain import ChainPublisher

    net = make_net(("trainer", "miner1"))  # the trainer is never started: the miner holds the genesis weights
    hub = LocalHub(read_genesis(net.genesis))
    mrt = hub.runtime("miner", net.ids["miner1"], net.root / "miner1")
    miner = Miner(mrt.env(MinerSettings))
    try:
        live, store = miner.host.live, mrt.env(MinerSettings).store
        v0 = snapshot(live.state)
        pub = ChainPublisher(tmp_path / "forger", Identity.generate(), "test-net", anchor_interval=100)
        assert pub.publish(v0).result_hash == live.hash
        promised = pub.publish(perturb(v0, 0.05, seed=7)).items[-1].manifest
        bad = forged(store, promised, v0, seed=8)
        miner.host.stage(Staged(1, bad.result_hash, [bad], miner.host.prepare([bad], store.get)))
        assert [w.version for w in miner.host.switch()] == [1] and miner.active.version == 1
        receipt = ("ab" * 32, "cd" * 32)  # a receipt in hand: the dropped batch would have followed it
        miner.chains.give_back(receipt)
        assert miner.produce_batch() is None
        assert miner.chains.take() == receipt  # not announced: the receipt is still good for the next
        snap = mrt.status.snapshot()
        assert snap["labelled"]["batch_failed"] == {"weights_unconfirmed": 1}
        assert snap["counters"].get("batches_announced", 0) == 0 and snap["counters"]["hash_mismatches"] == 1
        assert miner.active.version == 0 and miner.active.hash == live.hash and bits_equal(live.state, v0)
    finally:
        miner.close()


def test_a_miner_whose_engine_keeps_its_own_copy_pauses_only_for_the_engines_write(make_net, tmp_path) -> None:
    """The CUDA shape on the CPU (``share_weights=False``): a switch writes the changed elements into
    the engine's own copy, and the node's live copy is written by the confirm thread afterwards, not
    while generation is paused. The confirm thread is held off (it needs the live tensors' lock) so
    the order is seen, not raced."""
    from weightskit import bits_equal, perturb, snapshot

    from p2prl.crypto.keys import Identity
    from p2prl.node.weights.host import Staged
    from p2prl.patch.chain import ChainPublisher
    from p2prl.rl.model import unique_state

    net = make_net(("trainer", "miner1"))
    hub = LocalHub(read_genesis(net.genesis))
    mrt = hub.runtime("miner", net.ids["miner1"], net.root / "miner1")
    miner = Miner(mrt.env(MinerSettings), share_weights=False)
    try:
        live, store = miner.host.live, mrt.env(MinerSettings).store
        v0 = snapshot(live.state)
        v1 = perturb(v0, 0.05, seed=7)
        pub = ChainPublisher(tmp_path / "trainer", Identity.generate(), "test-net", anchor_interval=100)
        assert pub.publish(v0).result_hash == live.hash
        m = pub.publish(v1).items[-1]
        store.put(m.blob, expected_id=m.manifest.blob.id)
        plan = [m.manifest]
        with live._lock:  # the confirm thread waits for it
            miner.host.stage(Staged(1, m.manifest.result_hash, plan, miner.host.prepare(plan, store.get)))
            assert [w.version for w in miner.host.switch()] == [1]
            assert bits_equal(unique_state(miner.engine.model), v1)  # the engine runs the new version
            assert bits_equal(live.state, v0)  # the live copy waits for the confirm thread
        assert miner.host.settled(miner.active) and bits_equal(live.state, v1)
    finally:
        miner.close()
