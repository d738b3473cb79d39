"""Sparse lossless weight patches and the signed checkpoint chain (DESIGN §3, docs/PROTOCOL.md)."""

from p2prl.patch.chain import (
    ChainIndex,
    ChainPublisher,
    Published,
    PublishedVersion,
    materialize,
    open_manifest,
    plan_sync,
    retention,
)
from p2prl.patch.codec import (
    PatchApplier,
    PatchEncoder,
    PatchStats,
    apply_patch,
    encode_patch,
    inspect_patch,
    iter_patch,
)
from p2prl.patch.errors import PatchError
from p2prl.patch.format import CODEC
from p2prl.patch.hashing import weights_hash, weights_hash_file

__all__ = [
    "CODEC",
    "ChainIndex",
    "ChainPublisher",
    "PatchApplier",
    "PatchEncoder",
    "PatchError",
    "PatchStats",
    "Published",
    "PublishedVersion",
    "apply_patch",
    "encode_patch",
    "inspect_patch",
    "iter_patch",
    "materialize",
    "open_manifest",
    "plan_sync",
    "retention",
    "weights_hash",
    "weights_hash_file",
]
