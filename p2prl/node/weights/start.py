"""The weights a role starts from: the genesis model (checked, or fetched), the saved version or the
base, and for a miner or validator the host that holds them with its engine."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from p2prl.node.runtime.assets import AssetError, fetch_asset, install_model_files, publish_asset
from p2prl.node.runtime.role import NodeStartError, RoleEnv
from p2prl.node.setup.settings import RoleSettings
from p2prl.node.weights.disk import load_base_model, load_saved_weights, model_dir_for
from p2prl.node.weights.engine import open_engine
from p2prl.node.weights.host import ModelHost
from p2prl.node.weights.live import LiveWeights
from p2prl.node.weights.version import State, Weights
from p2prl.patch import ManifestStore
from p2prl.rl import ModelDirError, pack_files, pick_device

if TYPE_CHECKING:
    from torch.nn import Module

    from p2prl.rl import Tokenizer

log = logging.getLogger(__name__)


def base_model(env: RoleEnv[RoleSettings], strict: bool, share: bool = False) -> tuple[Module, Tokenizer, State, str]:
    """The genesis model for this node (its ``--model`` copy, the cache, the built-in one, or the
    files fetched from the network), checked against the genesis; a mismatch stops the node with a
    one-line reason. ``share``: the state is the model's own tensors on the CPU (load_base_model)."""
    cfg = env.settings.model

    def fetch(target: Path) -> Path:
        return install_model_files(fetch_asset(env, env.g.asset(env.g.model.files_sha256)), target)

    # the trainer is where the files come from: fetching them would wait on nobody, forever
    source = env.settings.role == "trainer"

    try:
        return load_base_model(
            env.g,
            cfg.cache_dir,
            cfg.model,
            pick_device(cfg.device),
            strict=strict,
            fetch=None if source else fetch,
            share=share,
        )
    except (ModelDirError, AssetError, FileNotFoundError, ValueError) as e:
        raise NodeStartError(str(e)) from e


def publish_model_files(env: RoleEnv[RoleSettings]) -> None:
    """Trainer: serve the genesis model's non-weight files (the ``model_files`` asset) to joining
    nodes, from its store and the S3 mirror. Its local files must be exactly the genesis ones."""
    spec = env.g.model
    if not spec.files_sha256:
        return
    data = pack_files(model_dir_for(spec, env.settings.model.model, env.settings.model.cache_dir))
    try:
        publish_asset(env, env.g.asset(spec.files_sha256), data)
    except AssetError as e:
        raise NodeStartError(str(e)) from e


def load_start(
    env: RoleEnv[RoleSettings], weights_dir: Path, share: bool = True
) -> tuple[Module, Tokenizer, Weights, State]:
    """The model object, tokenizer, the weights to start from (saved ones if valid, else the base)
    and the base state (the tensors the role's weights live in).

    The base model must hash to genesis' ``model.weights_hash``; if this machine builds it
    differently, it still starts from it as version 0 but unverified (``Weights.unverified``), so the
    first sync takes the slow path from an anchor instead of trusting a patch base it does not have.
    """
    # --model: must match
    model, tok, base, h = base_model(env, strict=env.settings.model.model is not None, share=share)
    saved = load_saved_weights(weights_dir)
    if saved is not None:
        log.info("resuming from saved weights v%d (%.12s)", saved.version, saved.hash)
        env.status.incr("restarts_resumed")
        return model, tok, saved, base
    if h != env.g.model.weights_hash:
        # the normal join: the model's files came from the network without weights (or this
        # machine builds the tiny model differently); version 0's anchor carries the weights
        log.info(
            "no local copy of the genesis weights (local %s, genesis %s): taking them from an anchor",
            h[:12],
            env.g.model.weights_hash[:12],
        )
        env.status.incr_label("warnings", "base_hash_mismatch")
        return model, tok, Weights.unverified(0, base), base
    return model, tok, Weights(0, h, base), base


@dataclass
class SyncedRole:
    """What a role that follows the trainer's chain starts with (miners and validators alike)."""

    dir: Path
    book: ManifestStore
    host: ModelHost  # the live weights, the engine, the current version, the saved copy
    tok: Tokenizer


def open_synced_role(
    env: RoleEnv[RoleSettings],
    name: str,
    keep: int = 1,
    share: bool = True,
    engine_state: Callable[[Weights], State] | None = None,
) -> SyncedRole:
    """The role's data directory, its manifest store, its tokenizer and the host of its weights: the
    weights to start from, held once (``keep`` versions reachable; without ``share`` apart from the
    engine's model, for a role whose engine runs other weights than the version it holds), and the
    engine. A miner's engine follows the newest version (``engine_state``: what it runs for one)."""
    d = env.data_dir / name
    d.mkdir(parents=True, exist_ok=True)
    book = ManifestStore(env.network_id, env.genesis.trainer_key, d / "manifests")
    weights_dir = d / "weights"
    model, tok, start, base = load_start(env, weights_dir, share)
    live = LiveWeights(base, start, keep)
    engine = open_engine(env, name, model, tok, live)
    host = ModelHost(env, live, engine, weights_dir, follow=name == "miner", engine_state=engine_state)
    return SyncedRole(d, book, host, tok)
