"""Restarts: the trainer resumes its chain without a version regression; miners and validators resume
from their stored weights and catch up. Real P2PNodes on 127.0.0.1, all in this process."""

from __future__ import annotations

import json

import pytest

from p2prl.bench.dishonest import perturb_state
from p2prl.demo import S3Server
from p2prl.net.gossip import Incoming
from p2prl.net.identity import peer_id_for
from p2prl.node.run import RunningNode, start_node
from p2prl.node.weights.disk import load_saved_weights
from p2prl.patch.hashing import weights_hash
from p2prl.proof.batch import commitment_root, decode_batch
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.messages import RolloutAnnouncement, decode_message, encode_message

pytestmark = pytest.mark.slow


def publish_next(trainer: RunningNode, seed: int) -> int:
    role = trainer.role
    pv = role.publish(perturb_state(role.chain.state, 0.01, seed=seed))
    return pv.version


def test_trainer_restart_resumes_chain(make_net, wait_for) -> None:
    net = make_net(("trainer", "validator"))
    t = start_node(net.config("trainer"))
    try:
        wait_for(lambda: t.role.chain.version == 0, 60, "version 0")
        t.role.pause()
        assert publish_next(t, 1) == 1
        assert publish_next(t, 2) == 2
        head = t.role.chain.result_hash
        assert (net.root / "trainer" / "trainer" / "checkpoint.pt").exists()
    finally:
        t.close()
    t = start_node(net.config("trainer"))
    try:
        assert t.role.version == 2 and t.role.chain.result_hash == head
        assert t.rt.status.counter("restarts_resumed") == 1
        assert weights_hash(t.role.chain.state) == head
        t.role.pause()
        assert publish_next(t, 3) == 3  # the next version, never a reused one
        m = t.role.chain.manifests.get(3, "delta")
        assert m.base_hash == head and m.base_version == 2
        assert t.rt.status.snapshot()["version"] == 3
    finally:
        t.close()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    for k, val in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, val)
    server = S3Server().start()
    server.create_bucket("restart-test")
    yield {"s3_enable": True, "s3_bucket": "restart-test", "s3_endpoint": server.endpoint}
    server.stop()


def replayed_announcement(miner: RunningNode, net) -> Incoming[RolloutAnnouncement]:
    """A freshly signed announcement of the miner's newest batch: what a replay or re-gossip delivers."""
    bid = miner.role.pinned[-1]
    data = miner.rt.store.get(bid)
    batch = decode_batch(data)
    ann = RolloutAnnouncement(
        version=batch.version,
        manifest_hash=batch.manifest_hash,
        blob=blob_ref_for(data, chunk_size=64 * 1024),
        groups=len(batch.groups),
        commitment_root=commitment_root(batch),
    )
    assert ann.blob.id == bid
    env, msg = decode_message(encode_message(net.ids["miner1"], "test-net", ann), "test-net")
    pid = peer_id_for(net.ids["miner1"])
    return Incoming("rollouts", env, msg, pid, pid)


def test_miner_and_validator_restart_from_stored_weights(make_net, wait_for, s3) -> None:
    """Versions published while they were down reach them (S3 mirror or gossip); after the restart
    new versions reach the miner by gossip alone (its second life runs without S3)."""
    net = make_net(("trainer", "validator", "miner1"))
    t = start_node(net.config("trainer", **s3))
    v = m = None
    try:
        wait_for(lambda: t.role.chain.version == 0, 60, "version 0")
        t.role.pause()  # versions move only when this test publishes
        v = start_node(net.config("validator", **s3))
        m = start_node(net.config("miner1", **s3))
        publish_next(t, 1)
        h1 = t.role.chain.result_hash
        wait_for(lambda: m.role.active.version == 1 and v.role.current.version == 1, 90, "v1 everywhere")
        wait_for(lambda: v.rt.status.counter("groups_accepted") > 0, 90, "accepted groups")
        # a repeated announcement of a judged blob is dropped, not re-checked (which would fail it
        # as duplicate_index and zero an honest miner)
        again = replayed_announcement(m, net)
        key = (again.envelope.signer_hex, again.message.blob.id)
        wait_for(lambda: key in v.role.jq.judged, 60, "the batch checked")
        v.role.on_announcement(again)
        dropped = lambda: v.rt.status.snapshot()["labelled"].get("dropped", {})  # noqa: E731
        wait_for(lambda: dropped().get("duplicate_announcement", 0) >= 1, 30, "replay dropped")
        snap = v.rt.status.snapshot()
        assert "duplicate_index" not in snap["labelled"].get("rejected", {})
        assert snap["scores"].get(net.ids["miner1"].public_hex, 0) > 0, snap["labelled"]
        m.close()
        v.close()
        m = v = None
        assert load_saved_weights(net.root / "miner1" / "miner" / "weights").hash == h1
        idx = json.loads((net.root / "miner1" / "miner" / "next_index.json").read_text())
        assert idx["version"] == 1 and idx["next"] > 0
        publish_next(t, 2)
        h2 = t.role.chain.result_hash
        v = start_node(net.config("validator", **s3))
        m = start_node(net.config("miner1"))  # no S3: manifests can only come by gossip
        for node in (m, v):
            assert node.rt.status.counter("restarts_resumed") == 1
            # resumed from disk (v1), possibly already on v2: it can sync that fast
            assert node.rt.status.snapshot()["weights_hash"] in (h1, h2)
        wait_for(lambda: m.role.active.hash == h2 and v.role.current.hash == h2, 90, "v2 after restart")
        # the fast path from the stored v1 (one delta), not a resync from v0 or the anchor
        for node in (m, v):
            assert node.rt.status.counter("slow_path_syncs") == 0
            assert node.rt.status.counter("patches_applied") == 1
        publish_next(t, 3)  # gossiped at once to the restarted peer id (not only the 10 s re-gossip)
        h3 = t.role.chain.result_hash
        wait_for(lambda: m.role.active.hash == h3, 60, "v3 by gossip after restart")
    finally:
        for node in (m, v, t):
            if node is not None:
                node.close()
