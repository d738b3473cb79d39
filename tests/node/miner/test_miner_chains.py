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
    now = C.time.time()
    monkeypatch.setattr(C.time, "time", lambda: now + C.SLOT_MAX_AGE_S + 1)
    assert ch.take() is None  # too old for a validator to hold its list


def test_a_restarted_miner_goes_on_with_its_chains_and_never_reuses_a_receipt(tmp_path, monkeypatch) -> None:
    """Announced batches and receipts in hand outlive a restart: a receipt that arrives after it (the
    trainer sends its recent lists again) still seeds a batch; a slot taken before a crash is gone."""
    path = tmp_path / "chains.json"
    ch = C.Chains(ME.public_key, path)
    for b in ("aa", "bb", "cc"):
        ch.announced(b * 32)
    first = incoming(TRAINER, Receipts(entries=(receipt_id(ME.public_key, "aa" * 32),), nonce="00" * 16))
    ch.on_receipts(first)
    again = C.Chains(ME.public_key, path)  # a restart
    assert again.take() == ("aa" * 32, first.envelope.digest.hex())
    assert C.Chains(ME.public_key, path).take() is None  # taken (a crash then): never a second batch on it
    late = incoming(TRAINER, Receipts(entries=(receipt_id(ME.public_key, "cc" * 32),), nonce="01" * 16))
    restarted = C.Chains(ME.public_key, path)
    restarted.on_receipts(late)  # a list sent again after the restart
    slot = restarted.take()
    assert slot == ("cc" * 32, late.envelope.digest.hex())
    restarted.give_back(slot)  # not announced: kept for the next run too
    assert C.Chains(ME.public_key, path).take() == slot
    now = C.time.time()
    monkeypatch.setattr(C.time, "time", lambda: now + C.SLOT_MAX_AGE_S + 1)
    restarted.give_back(slot)
    assert len(C.Chains(ME.public_key, path)) == 1
    monkeypatch.setattr(C.time, "time", lambda: now + 2 * C.SLOT_MAX_AGE_S + 2)
    assert len(C.Chains(ME.public_key, path)) == 0  # too old to load


def test_a_malformed_chains_file_starts_empty_and_keeps_what_is_well_formed(tmp_path) -> None:
    path = tmp_path / "chains.json"
    for bad in (b"", b"{", b"[]", b'{"waiting": 1, "slots": []}', b'{"waiting": [], "slots": {}}'):
        path.write_bytes(bad)
        ch = C.Chains(ME.public_key, path)
        assert len(ch) == 0 and ch.take() is None
    now = C.time.time()
    good = [now, "dd" * 32, "ee" * 32]
    rid = receipt_id(ME.public_key, "ff" * 32)
    path.write_text(
        C.json.dumps(
            {
                "waiting": [["xyz", "ff" * 32], [rid, "ff" * 32], [rid[:-2], "ff" * 32]],
                "slots": [["now", "dd" * 32, "ee" * 32], [now, "DD" * 32, "ee" * 32], good, [now, 1, 2], None],
            }
        )
    )
    ch = C.Chains(ME.public_key, path)
    assert len(ch) == 1 and ch.take() == ("dd" * 32, "ee" * 32)
    item = incoming(TRAINER, Receipts(entries=(rid,), nonce="02" * 16))
    ch.on_receipts(item)
    assert ch.take() == ("ff" * 32, item.envelope.digest.hex())
