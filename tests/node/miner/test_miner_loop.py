"""The miner's loop on an in-process network (the node's port without sockets; the default model):
it syncs the trainer's genesis anchor, mines batches under its quota, serves and announces them,
and the trainer's intake takes the announcements in."""

from __future__ import annotations

from localnet import LocalHub

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
    finally:
        for rt in (mrt, trt):
            rt.stop.set()
        for rt in (mrt, trt):
            rt.join(30)
