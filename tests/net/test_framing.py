"""Item 2 of docs/SECURITY.md: a forged ref must not get an honest holder banned, and bans expire."""

import time

import pytest

from p2prl.bench.peerproc import blob_bytes
from p2prl.net.config import Limits, NetConfig
from p2prl.net.node import FetchError
from p2prl.protocol.blobs import BlobRef, blob_ref_for

CH = 64 * 1024


def forged(ref: BlobRef) -> BlobRef:
    """The honest blob's id and size, with invented chunk hashes (what a hostile announcer signs)."""
    return BlobRef(ref.id, ref.size, ref.chunk_size, tuple(f"{i:064x}" for i in range(ref.n_chunks)))


def test_forged_ref_does_not_frame_the_holder(make_node) -> None:
    holder, victim = make_node("holder"), make_node("victim")
    data = blob_bytes(3, 5 * CH + 17)
    ref = blob_ref_for(data, CH)
    holder.store.put(data)
    holder.serve(ref)
    victim.connect(holder.addrs[0])
    victim.add_provider_hint(ref.id, holder.peer_id)
    with pytest.raises(FetchError):
        victim.fetch(forged(ref), timeout=3, s3=False)
    assert not victim.is_banned(holder.peer_id)
    assert victim.stats().get("bad_chunks", 0) == 0
    assert victim.fetch(ref, timeout=30, s3=False).read_bytes() == data


def test_bans_expire(make_node) -> None:
    holder = make_node("holder")
    victim = make_node("victim", config=NetConfig(limits=Limits(ban_s=1.0)))
    data = blob_bytes(4, 3 * CH)
    ref = blob_ref_for(data, CH)
    holder.store.put(data)
    holder.serve(ref)
    victim.connect(holder.addrs[0])
    victim._call_sync(victim.ban, holder.peer_id, "test")
    assert victim.is_banned(holder.peer_id)
    time.sleep(1.2)
    assert not victim.is_banned(holder.peer_id)
    assert victim.fetch(ref, timeout=30, s3=False).read_bytes() == data


def test_forgotten_ref_of_a_held_blob_is_served_again(tmp_path) -> None:
    """After a restart (or an evicted ref) a node computes its own ref of a blob it holds, once."""
    from p2prl.net.refs import RefBook
    from p2prl.store import BlobStore

    store = BlobStore(tmp_path / "s")
    data = blob_bytes(8, 3 * CH)
    refs = [blob_ref_for(data, CH), blob_ref_for(blob_bytes(9, CH), CH)]
    store.put(data)
    book = RefBook(store, capacity=1)
    book.add(refs[0])
    book.add(refs[1])  # evicts the first
    assert book.get(refs[0].digest) is None
    assert book.may_compute(refs[0].id, CH)
    assert book.compute(refs[0].id, CH) == refs[0]
    assert not book.may_compute(refs[0].id, CH)  # known now
    for k in (2, 3, 4):  # other chunk sizes, a bounded number of times
        assert book.compute(refs[0].id, k * CH) is not None
    assert not book.may_compute(refs[0].id, 5 * CH)
