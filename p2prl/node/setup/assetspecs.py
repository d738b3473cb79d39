"""The genesis' asset entries: files a network pins besides the weights (model files, task data).

``network init`` writes them; a running node fetches and serves them by these entries
(``p2prl.node.runtime.assets``). Kept apart from that module so that making a genesis needs no
running node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from p2prl.protocol import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, AssetSpec, blob_ref_for

MODEL_FILES_ASSET = "model_files"
TASK_DATA_ASSET = "task_data"


def asset_for(name: str, data: bytes, chunk_size: int) -> AssetSpec:
    """The genesis entry for ``data`` (chunk size clamped to what blob refs allow)."""
    ref = blob_ref_for(data, chunk_size=min(MAX_CHUNK_SIZE, max(MIN_CHUNK_SIZE, chunk_size)))
    return AssetSpec(name=name, id=ref.id, size=ref.size, chunk_size=ref.chunk_size, chunks=ref.chunks)


def task_data_asset(params: dict[str, Any], chunk_size: int) -> AssetSpec | None:
    """``network init``: the ``task_data`` asset of a data-backed task given ``path=FILE`` (its pinned
    ``data_sha256`` is the blob id), so a joining node without the file fetches it; None otherwise."""
    path, pinned = params.get("path"), params.get("data_sha256")
    if not path or not pinned:
        return None
    data = Path(path).read_bytes()
    asset = asset_for(TASK_DATA_ASSET, data, chunk_size)
    if asset.id != pinned:
        raise ValueError(f"task data file {path} does not hash to the pinned data_sha256 {pinned[:12]}…")
    return asset
