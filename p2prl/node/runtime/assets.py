"""Genesis assets: files a node needs besides the weights, carried as content-addressed blobs.

The trainer puts each asset it holds into its blob store (pinned, so peers can fetch it) and into the
S3 mirror; a node missing one fetches it from peers (S3 as fallback) with a progress bar, every chunk
checked against the genesis' chunk hashes and the whole against its id, so nothing unverified is
ever written where a model is loaded from. A fetched asset stays in the store and is re-served.
The genesis' entries themselves are made at network init (``p2prl.node.setup.assetspecs``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from p2prl.atomicfile import write_atomic
from p2prl.protocol import AssetSpec
from p2prl.rl import file_sha256

if TYPE_CHECKING:
    from p2prl.node.runtime.role import RoleEnv
    from p2prl.node.setup.settings import RoleSettings

log = logging.getLogger(__name__)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")  # what a data-backed task reads (rl/tasks/data.py)


class AssetError(Exception):
    """An asset that cannot be had, or whose bytes are not the ones the genesis names."""


def publish_asset(env: RoleEnv[RoleSettings], asset: AssetSpec, data: bytes) -> None:
    """Hold ``data`` as ``asset``: stored and pinned (peers fetch it from here) and mirrored to S3."""
    if hashlib.sha256(data).hexdigest() != asset.id:
        raise AssetError(f"the local {asset.name} do not hash to the genesis asset {asset.id[:12]}…")
    env.store.put(data, expected_id=asset.id)
    env.store.pin([asset.id])
    s3 = env.net.s3
    if s3 is not None:
        try:
            if not s3.has_blob(asset.id):
                s3.put_blob(asset.id, data)
        except Exception as e:  # S3 is a fallback: peers still serve it
            log.warning("S3 mirror of asset %s failed: %s", asset.name, e)


def fetch_asset(env: RoleEnv[RoleSettings], asset: AssetSpec) -> bytes:
    """The asset's bytes, from the store or fetched (peers, then S3) and verified; kept and served."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        f"fetching {asset.name}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        disable=not sys.stderr.isatty(),
        transient=True,
    ) as bar:
        task = bar.add_task(asset.name, total=asset.size)
        try:
            path = env.net.fetch(
                asset.ref,
                timeout=env.settings.fetch_timeout_s,
                on_progress=lambda done, _total: bar.update(task, completed=done),
            )
        except Exception as e:
            env.status.incr_label("asset_fetch_failed", asset.name)
            raise AssetError(f"cannot fetch {asset.name} {asset.id[:12]}… from peers or S3: {e}") from e
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != asset.id:  # the net layer checked it; the disk may not have
        env.status.incr_label("asset_fetch_failed", asset.name)
        raise AssetError(f"{asset.name} in the store does not hash to {asset.id[:12]}…")
    env.store.pin([asset.id])
    env.status.incr_label("assets_fetched", asset.name)
    log.info("fetched %s (%d bytes, sha256 %s…)", asset.name, asset.size, asset.id[:12])
    return data


def install_model_files(data: bytes, target: Path) -> Path:
    """Unpack a verified model-files blob into ``target`` (atomically: a crash leaves none or all)."""
    from p2prl.rl import unpack_files  # its module imports torch: only a joining node unpacks

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        unpack_files(data, tmp)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def task_data_file(env: RoleEnv[RoleSettings], data_sha256: str, genesis_path: str) -> Path:
    """Where this node reads the genesis task's data file: its fetched copy, the path the genesis names
    when that holds the pinned bytes, else fetched now (peers, then S3) and verified. The trainer
    serves the file (and mirrors it to S3) as the ``task_data`` asset."""
    asset = env.g.asset(data_sha256)
    name = Path(genesis_path).name
    if Path(name).suffix.lower() not in DATA_SUFFIXES or name.startswith("."):
        name = "data.jsonl"  # a name a peer chose never picks where or how the node reads
    cached = Path(env.data_dir) / "assets" / asset.id[:32] / name
    held = [p for p in (cached, Path(genesis_path)) if _holds(p, asset)]
    path = held[0] if held else cached
    if not held:
        data = fetch_asset(env, asset)
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, data)
    if env.settings.role == "trainer":
        publish_asset(env, asset, path.read_bytes())
    return path


def _holds(path: Path, asset: AssetSpec) -> bool:
    return path.is_file() and path.stat().st_size == asset.size and file_sha256(path) == asset.id
