"""The miner's chains: announced batches wait for the trainer's receipt; each receipt seeds one batch."""

from __future__ import annotations

from p2prl.crypto.keys import Identity
from p2prl.net import Incoming
from p2prl.node.miner import chains as C
from p2prl.protocol import Receipts, decode_message, encode_message, receipt_id

TRAINER, ME, OTHER = Identity(b"\x01" * 32), Identity(b"\x02" * 32), Identity(b"\x03" * 32)
NET = "chains-net"


def incoming(signer: Identity, msg: Receipts) -> Incoming[Receipts]:
    """A Receipts envelope as the pump hands it over: signed, verified, parsed."""
    env, parsed = decode_message(encode_message(signer, NET, msg), NET)
    assert isinstance(parsed, Receipts)
    return Incoming("manifests", env, parsed, "peer", "peer")


def test_receipts_become_slots_oldest_first_and_old_ones_seed_nothing(monkeypatch) -> None:
    ch = C.Chains(ME.public_key)
    ch.announced("aa" * 32)
    ch.announced("bb" * 32)
    assert ch.take() is None  # nothing receipted yet: a chain start
    entries = sorted({receipt_id(ME.public_key, "bb" * 32), receipt_id(OTHER.public_key, "aa" * 32)})
    item = incoming(TRAINER, Receipts(entries=tuple(entries), nonce="00" * 16))
    ch.on_receipts(item)
    assert len(ch) == 1  # another key's receipt of the same blob id is not ours
    digest = item.envelope.digest.hex()
    slot = ch.take()
    assert slot == ("bb" * 32, digest) and ch.take() is None
    ch.give_back(slot)  # a batch that was not announced: the receipt is still good
    assert ch.take() == slot
    ch.announced("cc" * 32)
    ch.on_receipts(incoming(TRAINER, Receipts(entries=(receipt_id(ME.public_key, "cc" * 32),), nonce="01" * 16)))
    now = C.time.monotonic()
    monkeypatch.setattr(C.time, "monotonic", lambda: now + C.SLOT_MAX_AGE_S + 1)
    assert ch.take() is None  # too old for a validator to hold its list
