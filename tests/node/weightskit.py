"""Weights for the node's tests: copies, seeded perturbations, bit-for-bit comparison, and a patch
that decodes but does not produce the result its manifest promises."""

from __future__ import annotations

import torch

from p2prl.patch import encode_patch
from p2prl.patch.dtypes import uint_view
from p2prl.patch.format import END, KIND_END, parse_end
from p2prl.protocol.blobs import MIN_CHUNK_SIZE, blob_ref_for


def snapshot(state):
    return {k: v.clone() for k, v in state.items()}


def perturb(state, density, seed):
    """A copy with about ``density`` of every tensor's elements one bf16 step away."""
    g = torch.Generator().manual_seed(seed)
    out = snapshot(state)
    for t in out.values():
        v = uint_view(t)
        v[(torch.rand(v.size, generator=g) < density).numpy()] ^= 1
    return out


def bits_equal(a, b):
    return set(a) == set(b) and all((uint_view(a[k]) == uint_view(b[k])).all() for k in a)


def forged(store, promised, base, seed):
    """A well-formed patch of other weights than ``promised``'s (a manifest from ``base``), its end
    record promising that manifest's result: it decodes, and only the hash of its result tells."""
    other = encode_patch(base, perturb(base, 0.05, seed=seed))
    n, _, digest = parse_end(other[-END.size :])
    blob = bytes(other[: -END.size]) + END.pack(KIND_END, 0, 0, 0, n, bytes.fromhex(promised.result_hash), digest)
    ref = blob_ref_for(blob, MIN_CHUNK_SIZE)
    store.put(blob, expected_id=ref.id)
    return type(promised)(**{**promised.__dict__, "blob": ref})
