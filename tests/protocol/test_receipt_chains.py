"""Receipt ids and chain seeds (docs/PROTOCOL.md §14): each binds everything it is made of."""

from __future__ import annotations

import hashlib

import pytest

from p2prl.protocol import RolloutAnnouncement, blob_ref_for, chain_seed, receipt_id
from p2prl.protocol.fields import MessageError

A, B = b"\x01" * 32, b"\x02" * 32


def test_a_receipt_names_its_signer_and_blob_and_a_seed_its_list_and_predecessor() -> None:
    blob = "ab" * 32
    assert receipt_id(A, blob) == hashlib.sha256(b"p2prl/receipt\x00" + A + bytes.fromhex(blob)).hexdigest()[:32]
    assert len({receipt_id(A, blob), receipt_id(B, blob), receipt_id(A, "ac" * 32)}) == 3
    digest = "cd" * 32
    assert chain_seed(digest, blob) == hashlib.sha256(b"p2prl/chain\x00" + bytes.fromhex(digest + blob)).hexdigest()
    assert len({chain_seed(digest, blob), chain_seed("ce" * 32, blob), chain_seed(digest, "ac" * 32)}) == 3


def test_a_chain_start_is_encoded_as_before_and_a_chained_batch_names_both_or_neither() -> None:
    ann = RolloutAnnouncement(3, "ab" * 32, blob_ref_for(b"x"), 2, "cd" * 32, created_ms=1)
    assert "prev" not in ann.to_body() and not ann.chained
    chained = RolloutAnnouncement(3, "ab" * 32, blob_ref_for(b"x"), 2, "cd" * 32, created_ms=1, prev="ef" * 32, receipts="01" * 32)
    assert RolloutAnnouncement.from_body(chained.to_body()) == chained and chained.chained
    for missing in ("prev", "receipts"):
        body = chained.to_body()
        del body[missing]
        with pytest.raises(MessageError):
            RolloutAnnouncement.from_body(body)
