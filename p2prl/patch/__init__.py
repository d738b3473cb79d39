"""Sparse lossless weight patches and the signed checkpoint chain (DESIGN §3, docs/PROTOCOL.md).

The codec, hashing and file commands import no torch (``p2prl patch diff`` starts in a fraction of
torch's import time); the chain, which holds torch state dicts, is loaded on first use.
"""

from typing import Any

from p2prl.patch.apply import PatchApplier, apply_patch
from p2prl.patch.dtypes import changed_fraction
from p2prl.patch.encode import PatchEncoder, PatchStats, encode_patch, iter_patch
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import CODEC
from p2prl.patch.hashing import weights_hash, weights_hash_file
from p2prl.patch.inspect import inspect_patch
from p2prl.patch.manifests import ManifestError, ManifestStore, manifest_file_name, open_manifest

__all__ = [
    "CODEC",
    "ChainPublisher",
    "ManifestError",
    "ManifestStore",
    "PatchApplier",
    "PatchEncoder",
    "PatchError",
    "PatchReason",
    "PatchStats",
    "Published",
    "PublishedVersion",
    "apply_patch",
    "changed_fraction",
    "encode_patch",
    "inspect_patch",
    "iter_patch",
    "manifest_file_name",
    "materialize",
    "open_manifest",
    "plan_sync",
    "retention",
    "weights_hash",
    "weights_hash_file",
]

_CHAIN = {
    "ChainPublisher",
    "Published",
    "PublishedVersion",
    "materialize",
    "plan_sync",
    "retention",
}


def __getattr__(name: str) -> Any:
    if name in _CHAIN:
        from p2prl.patch import chain

        return getattr(chain, name)
    raise AttributeError(f"module 'p2prl.patch' has no attribute {name!r}")
