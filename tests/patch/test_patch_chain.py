import pytest
import torch
from patch_testutil import bits_equal, perturb, random_state

from p2prl.crypto.keys import Identity
from p2prl.patch.chain import ChainPublisher, materialize, plan_sync, retention
from p2prl.patch.errors import PatchError
from p2prl.patch.hashing import weights_hash
from p2prl.patch.manifests import ManifestError, ManifestStore, open_manifest
from p2prl.protocol.blobs import MIN_CHUNK_SIZE
from p2prl.protocol.messages import PatchManifest, encode_message
from p2prl.store import BlobStore, StoreError

NET = "testnet"
SHAPES = {"w": (48, 40), "b": (40,), "n": (40,)}
TRAINER = Identity(b"\x01" * 32)


def _publisher(root, **kw):
    kw.setdefault("anchor_interval", 4)
    kw.setdefault("keep_versions", 100)
    return ChainPublisher(root, TRAINER, NET, chunk_size=MIN_CHUNK_SIZE, **kw)


def _run(pub, n, seed=0, state=None):
    """Publish ``n`` successive states; returns the published versions and the states."""
    state = state if state is not None else random_state(SHAPES, seed=seed)
    out, states = [], []
    for i in range(n):
        if i or pub.version is not None:
            state = perturb(state, 0.03, seed=seed * 1000 + i + 7)
        out.append(pub.publish(state))
        states.append(state)
    return out, states


class Node:
    """A receiver: verifies envelopes with the trainer key and keeps blobs in a BlobStore."""

    def __init__(self, root, published):
        self.store = BlobStore(root)
        self.index = ManifestStore(NET, TRAINER.public_key)
        for pv in published:
            for p in pv.items:
                self.index.add(p.envelope)
                self.store.put(p.blob, expected_id=p.manifest.blob.id)

    def sync(self, have_version, have_hash, state, target):
        plan = plan_sync(have_version, have_hash, self.index, target)
        return plan, materialize(state, plan, self.store.get, start_hash=have_hash)


def test_publish_layout_and_signatures(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, _ = _run(pub, 9)
    kinds = [[p.manifest.kind for p in pv.items] for pv in published]
    assert kinds[0] == ["anchor"] and kinds[4] == ["delta", "anchor"] and kinds[8] == ["delta", "anchor"]
    assert kinds[3] == ["delta"]
    for pv in published[1:]:
        d = pv.delta.manifest
        assert d.base_version == pv.version - 1 and d.anchor_version == pv.version - pv.version % 4
        assert d.base_hash == published[pv.version - 1].result_hash
    other = Identity(b"\x02" * 32)
    env = published[3].envelope
    assert open_manifest(env, NET, TRAINER.public_key).version == 3
    with pytest.raises(PatchError, match="manifest rejected"):
        open_manifest(env, NET, other.public_key)
    with pytest.raises(PatchError, match="manifest rejected"):
        open_manifest(env, "othernet", TRAINER.public_key)
    with pytest.raises(PatchError):
        open_manifest(env[:-1] + bytes([env[-1] ^ 1]), NET, TRAINER.public_key)


def test_fast_path_slow_path_and_mismatch(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, states = _run(pub, 11)
    node = Node(tmp_path / "n", published)
    # fast path: from version 5 with the right hash, deltas 6..10
    plan, got = node.sync(5, published[5].result_hash, states[5], 10)
    assert [(m.version, m.kind) for m in plan] == [(v, "delta") for v in range(6, 11)]
    assert bits_equal(got, states[10])
    # late joiner: newest anchor at or below the target, then deltas
    plan, got = node.sync(None, None, None, 10)
    assert [(m.version, m.kind) for m in plan] == [(8, "anchor"), (9, "delta"), (10, "delta")]
    assert bits_equal(got, states[10])
    # wrong hash at version 5: slow path
    bad = perturb(states[5], 0.01, seed=99)
    plan, got = node.sync(5, weights_hash(bad), bad, 10)
    assert plan[0].kind == "anchor" and bits_equal(got, states[10])
    # a gap (delta 7 missing): slow path from anchor 8, and to 7 no path through the gap
    node.index.discard([(7, "delta")])
    plan, got = node.sync(5, published[5].result_hash, states[5], 10)
    assert plan[0].version == 8 and bits_equal(got, states[10])
    plan, got = node.sync(5, published[5].result_hash, states[5], 6)
    assert [m.version for m in plan] == [6] and bits_equal(got, states[6])
    with pytest.raises(PatchError, match="no verified path"):
        plan_sync(5, published[5].result_hash, node.index, 7)
    assert plan_sync(10, published[10].result_hash, node.index, 10) == []


def test_fifty_link_chain_bit_exact(tmp_path):
    pub = _publisher(tmp_path / "t", anchor_interval=1000)
    published, states = _run(pub, 51, seed=3)
    node = Node(tmp_path / "n", published)
    plan, got = node.sync(None, None, None, 50)
    assert len(plan) == 51 and plan[0].kind == "anchor"
    assert bits_equal(got, states[50]) and weights_hash(got) == published[50].result_hash


def test_materialize_rejects_bad_blobs_and_never_touches_its_start(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, states = _run(pub, 6)
    node = Node(tmp_path / "n", published)
    start = {k: v.clone() for k, v in states[1].items()}
    plan = plan_sync(1, published[1].result_hash, node.index, 3)
    blobs = {p.manifest.blob.id: p.blob for pv in published for p in pv.items}

    def swap(target_id, data):
        return lambda i: data if i == target_id else blobs[i]

    wrong = published[5].delta.blob  # a valid patch for another version
    for load in (
        swap(plan[1].blob.id, wrong),
        swap(plan[1].blob.id, plan and blobs[plan[1].blob.id][:-1]),
        lambda i: (_ for _ in ()).throw(KeyError(i)),
    ):
        with pytest.raises(PatchError):
            materialize(states[1], plan, load, start_hash=published[1].result_hash)
    assert bits_equal(states[1], start)
    anchor = published[4].anchor
    tampered = bytearray(anchor.blob)
    tampered[-3] ^= 1
    with pytest.raises(PatchError, match="anchor"):
        materialize(None, [anchor.manifest], swap(anchor.manifest.blob.id, bytes(tampered)))
    with pytest.raises(PatchError):
        materialize(None, [anchor.manifest], swap(anchor.manifest.blob.id, b"junk" * 100))
    with pytest.raises(PatchError, match="no state"):
        materialize(None, [published[2].delta.manifest], blobs.__getitem__)


@pytest.mark.parametrize("interval,keep,n", [(4, 3, 11), (4, 1, 9), (3, 5, 14), (10, 2, 7)])
def test_retention_keeps_every_retained_version_reachable(tmp_path, interval, keep, n):
    pub = _publisher(tmp_path / "t", anchor_interval=interval, keep_versions=keep)
    _, states = _run(pub, n)
    keep_ids, drop_ids = retention(pub.manifests, keep)
    assert keep_ids.isdisjoint(drop_ids)
    kept = [m for m in pub.manifests.all() if m.blob.id in keep_ids]
    for target in range(max(0, n - keep), n):
        plan = plan_sync(None, None, kept, target)
        assert plan[0].kind == "anchor" and all(m.blob.id in keep_ids for m in plan)
    dropped = pub.prune()
    assert dropped == drop_ids and not any(pub.store.has(i) for i in dropped)
    # the pruned publisher still restarts and continues
    again = _publisher(tmp_path / "t", anchor_interval=interval, keep_versions=keep)
    assert again.version == n - 1 and bits_equal(again.state, states[-1])


def test_restart_resumes_without_version_regression(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, states = _run(pub, 6)
    del pub
    pub2 = _publisher(tmp_path / "t")
    assert pub2.version == 5 and pub2.result_hash == published[5].result_hash
    assert bits_equal(pub2.state, states[5])
    nxt = pub2.publish(perturb(states[5], 0.02, seed=42))
    assert nxt.version == 6 and nxt.delta.manifest.base_hash == published[5].result_hash
    with pytest.raises(PatchError, match="another network or trainer"):
        ChainPublisher(tmp_path / "t", Identity(b"\x03" * 32), NET)
    with pytest.raises(PatchError, match="another network or trainer"):
        ChainPublisher(tmp_path / "t", TRAINER, "othernet")


def test_restart_after_losing_its_blobs_refuses(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, _ = _run(pub, 3)
    pub.store.delete(published[2].delta.manifest.blob.id)
    with pytest.raises(PatchError):
        _publisher(tmp_path / "t")


def test_conflicting_manifests_are_refused(tmp_path):
    pub = _publisher(tmp_path / "t")
    published, _ = _run(pub, 3)
    m = published[2].delta.manifest
    forged = PatchManifest(**{**m.__dict__, "result_hash": "0" * 64})
    with pytest.raises(PatchError, match="disagree"):
        plan_sync(None, None, [m, forged], 2)
    # signed by the trainer key itself (a fork): the store refuses it, and so does the publisher's
    with pytest.raises(ManifestError, match="conflicting"):
        pub.manifests.add(encode_message(TRAINER, NET, forged))
    assert pub.manifests.get(2) == m and pub.manifests.conflicts == 1


def test_publish_copies_the_state(tmp_path):
    pub = _publisher(tmp_path / "t")
    s = random_state(SHAPES)
    pv = pub.publish(s)
    s["w"].view(torch.int16)[0, 0] ^= 1
    assert weights_hash(pub.state) == pv.result_hash


@pytest.mark.parametrize("density", [0.004, 0.1, 0.6])
def test_the_chains_copy_follows_by_the_changed_elements_only(tmp_path, density):
    """After a delta the chain's copy is brought up by the changes alone (scattered, segment copies
    for many changes, dense segments whole): it equals what was published, never aliases the
    caller's tensors, and the next delta is made against it."""
    pub = ChainPublisher(tmp_path / "t", TRAINER, NET, chunk_size=MIN_CHUNK_SIZE, anchor_interval=100)
    state = random_state({"w": (300, 40), "b": (40,), "z": (5,)})
    start = {k: v.clone() for k, v in state.items()}
    published = [pub.publish(state)]
    copy = pub.state
    for i in range(3):
        state = perturb(state, density, seed=50 + i)
        state["z"] = start["z"].clone()  # one tensor never changes
        published.append(pub.publish(state))
        assert pub.state is copy and bits_equal(copy, state) and weights_hash(copy) == published[-1].result_hash
        assert all(copy[k].data_ptr() != state[k].data_ptr() for k in state)
    _, got = Node(tmp_path / "n", published).sync(0, weights_hash(start), start, 3)
    assert bits_equal(got, state)


def test_a_publish_that_fails_to_store_leaves_the_chain_at_its_last_commit(tmp_path):
    """The chain's copy moves on beside the signing and storing; when storing fails (a store full of
    pinned blobs) the publish raises, the publisher is back at its last committed version, bit for
    bit, and the same state is published again as the next version, which a node follows."""
    pub = _publisher(tmp_path / "t", anchor_interval=100)
    published, states = _run(pub, 3)
    before = {k: v.clone() for k, v in pub.state.items()}
    bound = pub.store.max_bytes
    pub.store.max_bytes = sum(pub.store._sizes.values())  # room for nothing more: every blob is pinned
    nxt = perturb(states[-1], 0.2, seed=99)
    with pytest.raises(StoreError, match="pinned"):
        pub.publish(nxt)
    assert pub.version == 2 and pub.result_hash == published[-1].result_hash
    assert bits_equal(pub.state, before) and not bits_equal(pub.state, nxt)
    assert pub.manifests.newest().version == 2
    pub.store.max_bytes = bound
    published.append(pub.publish(nxt))
    assert published[-1].version == 3 and published[-1].delta.manifest.base_hash == published[2].result_hash
    _, got = Node(tmp_path / "n", published).sync(0, published[0].result_hash, states[0], 3)
    assert bits_equal(got, nxt) and bits_equal(pub.state, nxt)
