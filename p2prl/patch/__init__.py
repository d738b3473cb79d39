"""Sparse lossless weight patches and the signed checkpoint chain (DESIGN §3, docs/PROTOCOL.md).

The codec, hashing and file commands import no torch (``p2prl patch diff`` starts in a fraction of
torch's import time); the chain, which holds torch state dicts, is loaded on first use.
"""

from typing import TYPE_CHECKING

from p2prl.lazyexports import lazy_exports
from p2prl.patch.apply import PatchApplier, SegmentChange, apply_patch
from p2prl.patch.dtypes import changed_fraction, uint_view
from p2prl.patch.encode import PatchEncoder, PatchStats, encode_patch, iter_patch
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.files import apply_files, diff_files
from p2prl.patch.format import CODEC
from p2prl.patch.hashing import sorted_names, weights_hash, weights_hash_file, weights_sha256
from p2prl.patch.inspect import inspect_patch
from p2prl.patch.manifests import ManifestError, ManifestStore, manifest_file_name, open_manifest
from p2prl.patch.scatter import scatter_all

if TYPE_CHECKING:
    from p2prl.patch.anchors import decode_anchor
    from p2prl.patch.chain import (
        ChainPublisher,
        Published,
        PublishedVersion,
        checked_blob,
        materialize,
        plan_sync,
        retention,
    )

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
    "SegmentChange",
    "apply_files",
    "apply_patch",
    "changed_fraction",
    "checked_blob",
    "decode_anchor",
    "diff_files",
    "encode_patch",
    "inspect_patch",
    "iter_patch",
    "manifest_file_name",
    "materialize",
    "open_manifest",
    "plan_sync",
    "retention",
    "scatter_all",
    "sorted_names",
    "uint_view",
    "weights_hash",
    "weights_hash_file",
    "weights_sha256",
]

__getattr__ = lazy_exports(__name__)
