"""Weight sync driven through the node's network port, in-process: the trainer's real chain
publisher signs and serves; a follower keeps the gossiped manifests in its ManifestStore, fetches
through the port and stages verified weights. A fork signed with the trainer key is refused."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from genesiskit import MODEL
from localnet import LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net.topics import topic
from p2prl.node.netinit import NetworkSpec, genesis_from_spec
from p2prl.node.settings import MinerSettings
from p2prl.node.sync import WeightSync
from p2prl.node.weights import Weights
from p2prl.patch.chain import ChainPublisher
from p2prl.patch.manifests import ManifestStore
from p2prl.protocol.messages import PatchManifest, encode_message

NET = "sync-net"
TRAINER, MINER = Identity(b"\x0a" * 32), Identity(b"\x0b" * 32)


def states(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    s = {"w": torch.randn(48, 32, generator=g).to(torch.bfloat16), "b": torch.zeros(32, dtype=torch.bfloat16)}
    out = [s]
    for _ in range(n - 1):
        bump = (torch.rand(48, 32, generator=g) < 0.05).to(torch.bfloat16)
        s = {"w": s["w"] + bump, "b": s["b"] + 1}
        out.append(s)
    return out


def test_follower_syncs_through_the_port_and_refuses_a_fork(tmp_path: Path) -> None:
    hub = LocalHub(genesis_from_spec(NetworkSpec(network_id=NET), TRAINER, MODEL))
    trainer = hub.runtime("trainer", TRAINER, tmp_path / "trainer")
    chain = ChainPublisher(tmp_path / "trainer" / "chain", TRAINER, NET, anchor_interval=2, store=trainer.store)
    miner = hub.runtime("miner", MINER, tmp_path / "miner")
    book = ManifestStore(NET, TRAINER.public_key, tmp_path / "miner" / "manifests")
    sync = WeightSync(miner.env(MinerSettings), book, Weights(0, "", {}), tmp_path / "miner" / "weights")
    want = states(4)
    for s in want:
        for item in chain.publish(s).items:
            trainer.net.serve(item.manifest.blob)
            trainer.outbox.publish_raw("manifests", item.envelope)
    head = chain.manifests.get(3)
    fork = PatchManifest(**{**head.__dict__, "result_hash": "ee" * 32})
    trainer.net.publish(topic(NET, "manifests"), encode_message(TRAINER, NET, fork))
    for item in miner.net.poll(timeout=0.1):  # the pump's work, with the miner's handler
        sync.on_manifest(item)
    assert [(m.version, m.kind) for m in book.all()][-2:] == [(2, "delta"), (3, "delta")]
    assert book.conflicts == 1 and miner.status.snapshot()["labelled"]["dropped"]["manifest"] == 1
    t = threading.Thread(target=sync.run)
    t.start()
    deadline = time.monotonic() + 20
    staged = None
    while staged is None and time.monotonic() < deadline:
        staged = sync.take_staged()
        time.sleep(0.05)
    miner.stop.set()
    t.join(10)
    assert staged is not None and staged.version == 3 and staged.hash == head.result_hash
    assert all(torch.equal(staged.state[k].view(torch.int16), want[3][k].view(torch.int16)) for k in want[3])
    assert miner.status.snapshot()["counters"]["slow_path_syncs"] == 1  # from the anchor at 2
