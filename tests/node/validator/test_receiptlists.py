"""A validator keeps the trainer's receipts lists by envelope digest, bounded."""

from __future__ import annotations

from p2prl.crypto.keys import Identity
from p2prl.net import Incoming
from p2prl.node.validator.receiptlists import ReceiptLists
from p2prl.protocol import Receipts, decode_message, encode_message

TRAINER = Identity(b"\x05" * 32)


def _item(nonce: str) -> Incoming[Receipts]:
    env, msg = decode_message(encode_message(TRAINER, "n", Receipts(entries=("00" * 16,), nonce=nonce)), "n")
    assert isinstance(msg, Receipts)
    return Incoming("manifests", env, msg, "p", "p")


def test_lists_are_found_by_digest_and_the_oldest_forgotten() -> None:
    lists = ReceiptLists(kept=2)
    items = [_item(f"{i:032x}") for i in range(3)]
    for it in items:
        lists.on_receipts(it)
    assert lists.entries(items[0].envelope.digest.hex()) is None
    assert lists.entries(items[2].envelope.digest.hex()) == frozenset({"00" * 16})
    assert lists.entries("ff" * 32) is None


def test_a_restarted_validator_still_has_the_lists_it_saw(tmp_path) -> None:
    """The trainer sends a list again only while no newer one follows: a validator's restart must
    not lose the lists its miners' chained batches name (each resend is kept once)."""
    path = tmp_path / "receipts.jsonl"
    lists = ReceiptLists(kept=2, path=path)
    items = [_item(f"{i:032x}") for i in range(3)]
    for it in (*items, items[2], items[2]):
        lists.on_receipts(it)
    lists.close()
    assert len(path.read_text().splitlines()) == 2  # rewritten from the two kept once it outgrew them
    with path.open("a") as f:
        f.write('{"d": "zz", "e": []}\n{"d": "' + "ab" * 32)  # junk, then a torn line
    again = ReceiptLists(kept=2, path=path)
    assert again.entries(items[0].envelope.digest.hex()) is None  # past the bound, as before
    assert again.entries(items[1].envelope.digest.hex()) == frozenset({"00" * 16})
    assert again.entries(items[2].envelope.digest.hex()) == frozenset({"00" * 16})
    assert len(path.read_text().splitlines()) == 2  # rewritten compacted at start
