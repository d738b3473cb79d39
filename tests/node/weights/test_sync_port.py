"""Weight sync driven through the node's network port, in-process: the trainer's real chain
publisher signs and serves; a follower keeps the gossiped manifests in its ManifestStore, fetches
through the port and applies verified patches to its one copy of the weights (node/weights/live.py). A fork
signed with the trainer key is refused; unverified start weights are never a patch base."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from genesiskit import MODEL
from localnet import LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net.topics import topic
from p2prl.node.runtime.runtime import NodeRuntime
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.node.setup.settings import MinerSettings
from p2prl.node.weights.disk import load_saved_weights
from p2prl.node.weights.host import ModelHost
from p2prl.node.weights.live import LiveWeights
from p2prl.node.weights.sync import WeightSync
from p2prl.node.weights.version import Weights
from p2prl.patch.chain import ChainPublisher
from p2prl.patch.errors import PatchError
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


def local_build() -> dict[str, torch.Tensor]:
    """The base model as a machine that builds it differently from the genesis has it."""
    return {"w": torch.zeros(48, 32, dtype=torch.bfloat16), "b": torch.zeros(32, dtype=torch.bfloat16)}


def follower(rt: NodeRuntime, book: ManifestStore, weights_dir: Path) -> tuple[WeightSync, ModelHost]:
    """A follower starting unverified at version 0, its weights held once (as open_synced_role); no
    engine: it only syncs."""
    base = local_build()
    env = rt.env(MinerSettings)
    host = ModelHost(env, LiveWeights(base, Weights.unverified(0, base)), None, weights_dir, follow=False)  # type: ignore[arg-type]
    return WeightSync(env, book, host), host


def deliver(rt: NodeRuntime, sync: WeightSync) -> None:
    for item in rt.net.poll(timeout=0.1):  # the pump's work, with the follower's handler
        sync.on_manifest(item)


def take(host: ModelHost, version: int, timeout: float = 20) -> Weights:
    """What the role's loop does: switch to staged versions until ``version`` is reached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = host.switch()
        if done and done[-1].version >= version:
            return done[-1]
        time.sleep(0.05)
    raise AssertionError(f"v{version} not reached")


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def test_follower_syncs_through_the_port_and_refuses_a_fork(tmp_path: Path) -> None:
    hub = LocalHub(genesis_from_spec(NetworkSpec(network_id=NET), TRAINER, MODEL))
    trainer = hub.runtime("trainer", TRAINER, tmp_path / "trainer")
    chain = ChainPublisher(tmp_path / "trainer" / "chain", TRAINER, NET, anchor_interval=2, store=trainer.store)
    miner = hub.runtime("miner", MINER, tmp_path / "miner")
    book = ManifestStore(NET, TRAINER.public_key, tmp_path / "miner" / "manifests")
    sync, host = follower(miner, book, tmp_path / "miner" / "weights")
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
        done = host.switch()
        staged = done[-1] if done else None
        time.sleep(0.05)
    miner.stop.set()
    t.join(10)
    assert staged is not None and staged.version == 3 and staged.hash == head.result_hash
    assert all(torch.equal(staged.state[k].view(torch.int16), want[3][k].view(torch.int16)) for k in want[3])
    assert miner.status.snapshot()["counters"]["slow_path_syncs"] == 1  # from the anchor at 2



class Net:
    """A trainer publishing through the port, and one follower starting unverified at version 0."""

    def __init__(self, tmp_path: Path) -> None:
        hub = LocalHub(genesis_from_spec(NetworkSpec(network_id=NET), TRAINER, MODEL))
        self.trainer = hub.runtime("trainer", TRAINER, tmp_path / "trainer")
        self.chain = ChainPublisher(
            tmp_path / "trainer" / "chain", TRAINER, NET, anchor_interval=4, store=self.trainer.store
        )
        self.miner = hub.runtime("miner", MINER, tmp_path / "miner")
        self.book = ManifestStore(NET, TRAINER.public_key, tmp_path / "miner" / "manifests")
        self.weights_dir = tmp_path / "miner" / "weights"
        self.sync, self.host = follower(self.miner, self.book, self.weights_dir)
        self.live = self.host.live

    def publish(self, s: dict[str, torch.Tensor]) -> None:
        for item in self.chain.publish(s).items:
            self.trainer.net.serve(item.manifest.blob)
            self.trainer.outbox.publish_raw("manifests", item.envelope)
        deliver(self.miner, self.sync)

    def counter(self, name: str) -> int:
        return self.miner.status.snapshot()["counters"].get(name, 0)

    def running(self) -> threading.Thread:
        t = threading.Thread(target=self.sync.run)
        t.start()
        return t

    def stop(self, t: threading.Thread) -> None:
        self.miner.stop.set()
        t.join(10)


def test_unverified_start_is_never_a_patch_base_and_syncs_from_an_anchor(tmp_path: Path) -> None:
    """A node whose base model does not hash to the genesis' starts at version 0 unverified: the
    delta to version 1 is refused on it, nothing is saved, and sync goes through version 0's anchor;
    from the verified version on, deltas apply; the first is saved at once, later ones at most every
    30 s and when the role stops."""
    net, want = Net(tmp_path), states(3)
    assert not net.host.current.verified and net.host.current.hash is None
    assert net.miner.status.snapshot()["weights_hash"] == ""  # the status shows unverified as ""
    net.publish(want[0])
    net.publish(want[1])
    delta = net.book.get(1, "delta")
    assert delta is not None and delta.base_hash == net.book.get(0, "anchor").result_hash
    net.miner.store.put(net.trainer.store.get(delta.blob.id), expected_id=delta.blob.id)
    before = {k: v.clone() for k, v in net.live.state.items()}
    with pytest.raises(PatchError, match="state is unverified"):
        net.live.advance([delta], net.miner.store.get)
    assert bits_equal(net.live.state, before) and not net.live.verified
    assert load_saved_weights(net.weights_dir) is None

    t = net.running()
    try:
        w = take(net.host, 1)
        assert w.verified and w.hash == delta.result_hash and bits_equal(w.state, want[1])
        assert net.counter("slow_path_syncs") == 1  # anchor 0, then delta 1
        saved = load_saved_weights(net.weights_dir)
        assert saved is not None and saved.version == 1 and saved.hash == delta.result_hash
        net.publish(want[2])  # verified now: the next delta applies on it, no second anchor
        w = take(net.host, 2)
        assert w.hash == net.book.get(2, "delta").result_hash and bits_equal(net.live.state, want[2])
        assert net.counter("slow_path_syncs") == 1 and net.counter("sync_failures") == 0
        assert net.miner.status.snapshot()["weights_hash"] == w.hash
        saved = load_saved_weights(net.weights_dir)  # saves are spaced: the whole model each
        assert saved is not None and saved.version == 1
    finally:
        net.stop(t)
    net.host.close()  # the role stopping saves the newest version
    saved = load_saved_weights(net.weights_dir)
    assert saved is not None and saved.version == 2 and bits_equal(saved.state, want[2])


def test_unverified_start_at_the_head_version_takes_its_anchor(tmp_path: Path) -> None:
    """Unverified weights at the trainer's own version are behind it too: version 0's anchor replaces them."""
    net, want = Net(tmp_path), states(1)
    net.publish(want[0])
    t = net.running()
    try:
        w = take(net.host, 0)
        assert w.verified and w.hash == net.book.get(0, "anchor").result_hash and bits_equal(w.state, want[0])
        assert net.counter("slow_path_syncs") == 1
    finally:
        net.stop(t)


def test_a_patch_that_misses_its_signed_hash_is_counted_and_never_applied(tmp_path: Path) -> None:
    """A trainer-signed delta whose bytes do not give the result hash it signs: refused on every
    try, counted as ``hash_mismatches`` (what operators alert on), the weights left as they were."""
    net, want = Net(tmp_path), states(2)
    net.publish(want[0])
    t = net.running()
    try:
        take(net.host, 0)
        pv = net.chain.publish(want[1])
        for item in pv.items:
            net.trainer.net.serve(item.manifest.blob)
        forged = PatchManifest(**{**pv.manifest.__dict__, "result_hash": "ee" * 32})
        net.trainer.net.publish(topic(NET, "manifests"), encode_message(TRAINER, NET, forged))
        deliver(net.miner, net.sync)
        deadline = time.monotonic() + 20
        while net.counter("hash_mismatches") == 0 and time.monotonic() < deadline:
            assert net.host.switch() == []
            time.sleep(0.05)
        assert net.counter("hash_mismatches") >= 1
        assert net.host.current.version == 0 and bits_equal(net.live.state, want[0])
    finally:
        net.stop(t)
