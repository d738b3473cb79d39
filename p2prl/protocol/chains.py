"""Receipt chains: where a miner's next prompts come from once the trainer has receipted its last batch.

A key that picked its prompts after seeing them could keep the best of many keys' (key grinding). So
a batch's prompts and uniforms are seeded by a list of receipts the trainer signs after it received
the key's previous batch (``Receipts``): the seed mixes that list's envelope digest, unknown until
the trainer sends it, with the previous batch's blob id, so each receipt seeds one batch and a key
whose previous batch was receipted has exactly one next seed (docs/PROTOCOL.md §14).
"""

from __future__ import annotations

import hashlib

RECEIPT_BYTES = 16
_RECEIPT = b"p2prl/receipt\x00"
_CHAIN = b"p2prl/chain\x00"


def receipt_id(signer: bytes, blob_id: str) -> str:
    """The receipt of a batch announced by ``signer`` with ``blob_id``: it names the signer, so no key
    can claim another key's receipt."""
    return hashlib.sha256(_RECEIPT + bytes(signer) + bytes.fromhex(blob_id)).hexdigest()[: 2 * RECEIPT_BYTES]


def chain_seed(receipts_digest: str, prev: str) -> str:
    """The public seed (hex) of the batch that follows blob ``prev``, receipted in the ``Receipts``
    envelope of digest ``receipts_digest``: it stands where a version's manifest hash seeds a chain
    start's prompts and uniforms."""
    return hashlib.sha256(_CHAIN + bytes.fromhex(receipts_digest) + bytes.fromhex(prev)).hexdigest()
