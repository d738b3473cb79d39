"""The trainer's receipt book: bounded lists, each receipt good for one chained batch of its own key."""

from __future__ import annotations

import hashlib

import pytest

from p2prl.crypto.keys import Identity
from p2prl.node.trainer import receipts as R
from p2prl.protocol import Receipts, RolloutAnnouncement, blob_ref_for, decode_message, receipt_id
from p2prl.protocol.messages import MessageError
from p2prl.reasons import NodeDrop

NET = "receipts-net"
TRAINER = Identity(b"\x07" * 32)
A, B = Identity(b"\x08" * 32), Identity(b"\x09" * 32)


def _chained(prev: str, digest: str) -> RolloutAnnouncement:
    return RolloutAnnouncement(3, "ab" * 32, blob_ref_for(b"batch"), 2, "cd" * 32, prev=prev, receipts=digest)


def test_a_list_receipts_what_came_and_each_receipt_seeds_one_batch() -> None:
    book = R.ReceiptBook(TRAINER, NET)
    assert book.take() is None  # nothing pending: no list
    assert book.add(A.public_key, "11" * 32, trusted=True) is None
    assert book.add(A.public_key, "11" * 32, trusted=True) is None  # the same announcement again: one entry
    assert book.add(B.public_key, "22" * 32, trusted=False) is None
    raw = book.take()
    assert raw is not None and book.take() is None
    _, msg = decode_message(raw, NET, allowed_signers={TRAINER.public_key})
    assert isinstance(msg, Receipts)
    assert set(msg.entries) == {receipt_id(A.public_key, "11" * 32), receipt_id(B.public_key, "22" * 32)}
    digest = hashlib.sha256(raw).hexdigest()
    assert not book.seeds(A.public_hex, _chained("11" * 32, "00" * 32))  # another list than the one that listed it
    assert not book.seeds(B.public_hex, _chained("11" * 32, digest))  # A's receipt claimed by B
    assert book.seeds(A.public_hex, _chained("11" * 32, digest))
    assert not book.seeds(A.public_hex, _chained("11" * 32, digest))  # used: one batch per receipt
    assert book.seeds(B.public_hex, _chained("22" * 32, digest))
    assert not book.seeds(A.public_hex, RolloutAnnouncement(3, "ab" * 32, blob_ref_for(b"x"), 2, "cd" * 32))


def test_keys_without_accepted_work_fill_at_most_half_a_list_and_one_key_its_share() -> None:
    """Keys are free: a flood of new keys must leave room for the receipts of miners with accepted
    work, and one key may not fill a list."""
    book = R.ReceiptBook(TRAINER, NET, max_entries=8)
    new_keys = [Identity.generate() for _ in range(6)]
    got = [book.add(k.public_key, f"{i:02x}" * 32, trusted=False) for i, k in enumerate(new_keys)]
    assert got == [None] * 4 + [NodeDrop.RECEIPTS_FULL] * 2
    assert [book.add(A.public_key, f"{i + 16:02x}" * 32, trusted=True) for i in range(5)] == [None] * 4 + [
        NodeDrop.RECEIPTS_FULL
    ]
    book = R.ReceiptBook(TRAINER, NET)
    assert [book.add(A.public_key, f"{i:064x}", trusted=True) for i in range(R.PER_SIGNER + 1)][-2:] == [
        None,
        NodeDrop.RECEIPTS_FULL,
    ]


def test_a_list_must_be_sorted_distinct_and_bounded() -> None:
    ok = Receipts(entries=("00" * 16, "01" * 16), nonce="ab" * 16)
    assert Receipts.from_body(ok.to_body()) == ok
    for entries in (["01" * 16, "00" * 16], ["00" * 16, "00" * 16], ["00" * 15]):
        with pytest.raises(MessageError):
            Receipts.from_body({**ok.to_body(), "entries": entries})
    with pytest.raises(MessageError):
        Receipts.from_body({**ok.to_body(), "entries": [f"{i:032x}" for i in range(Receipts.MAX_ENTRIES + 1)]})


def test_a_list_is_sent_again_on_its_schedule_while_a_receipt_in_it_is_unused() -> None:
    """Gossip is lossy and miners restart: a list goes out again 5, 30, 120 and 300 s after it
    first did, each time only while one of its receipts has seeded no batch."""
    book = R.ReceiptBook(TRAINER, NET)
    book.add(A.public_key, "11" * 32, trusted=True)
    book.add(B.public_key, "22" * 32, trusted=True)
    raw = book.take(now=100.0)
    digest = hashlib.sha256(raw).hexdigest()
    assert book.due(now=104.0) == []
    assert book.due(now=105.0) == [raw]
    assert book.due(now=106.0) == []  # once per delay
    assert book.seeds(A.public_hex, _chained("11" * 32, digest))  # B's receipt is still unused
    assert book.due(now=130.0) == [raw]
    assert book.due(now=1000.0) == [raw]  # past both later delays at once: one send, then done
    assert book.due(now=2000.0) == []
    book.add(A.public_key, "33" * 32, trusted=True)
    raw = book.take(now=3000.0)
    assert book.seeds(A.public_hex, _chained("33" * 32, hashlib.sha256(raw).hexdigest()))
    assert book.due(now=3005.0) == []  # every receipt in it seeded its batch: never sent again


def test_the_lists_kept_for_sending_again_are_bounded_in_bytes(monkeypatch) -> None:
    monkeypatch.setattr(R, "HISTORY_BYTES", 1)
    book = R.ReceiptBook(TRAINER, NET)
    for i in range(3):
        book.add(A.public_key, f"{i:064x}", trusted=True)
        last = book.take(now=0.0)
    assert book.due(now=5.0) == [] and last is not None  # nothing fits: nothing is kept


def test_a_list_sent_while_its_miner_was_down_reaches_it_when_sent_again(tmp_path) -> None:
    """A miner that announced a batch and was down when its receipt went out (and when the list
    went out again 5 s later) gets it from the next send and chains on it after its restart."""
    from p2prl.net import Incoming
    from p2prl.node.miner.chains import Chains

    path = tmp_path / "chains.json"
    Chains(A.public_key, path).announced("44" * 32)
    book = R.ReceiptBook(TRAINER, NET)
    book.add(A.public_key, "44" * 32, trusted=True)
    book.take(now=0.0)  # the miner is down: this list never reaches it
    assert len(book.due(now=5.0)) == 1  # nor this one
    miner = Chains(A.public_key, path)  # started again
    assert miner.take() is None
    (again,) = book.due(now=40.0)
    env, msg = decode_message(again, NET, allowed_signers={TRAINER.public_key})
    assert isinstance(msg, Receipts)
    miner.on_receipts(Incoming("manifests", env, msg, "peer", "peer"))
    slot = miner.take()
    assert slot is not None and slot[0] == "44" * 32
    assert book.seeds(A.public_hex, _chained(*slot))
