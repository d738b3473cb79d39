"""Anchors: full checkpoints as safetensors bytes, checked against their weights hash on load."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.hashing import read_safetensors_header, weights_hash

ANCHOR_CODEC = "safetensors"


def encode_anchor(state: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in state.items()})


def decode_anchor(
    blob: bytes | bytearray | memoryview, expected_hash: str | None = None
) -> dict[str, torch.Tensor]:
    """Parse an anchor; when ``expected_hash`` is given the weights must hash to it."""
    from safetensors.torch import load

    read_safetensors_header(memoryview(blob))  # bounds and dtypes before the library sees it
    try:
        state = load(bytes(blob))
    except Exception as e:  # the library raises several types on malformed input
        raise PatchError(PatchReason.MALFORMED, f"anchor is not a valid safetensors file: {e}") from None
    if expected_hash is not None:
        got = weights_hash(state)
        if got != expected_hash:
            raise PatchError(
                PatchReason.HASH_MISMATCH,
                f"anchor hash mismatch: got {got[:16]}…, expected {expected_hash[:16]}…",
            )
    return state
