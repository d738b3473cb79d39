"""Pieces shared by the roles: generation settings from genesis, the task, the starting weights."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2prl.node.context import NodeContext, NodeStartError
from p2prl.node.manifests import ManifestBook
from p2prl.node.weights import Weights, load_base_model, load_saved_weights
from p2prl.patch.hashing import weights_hash

log = logging.getLogger(__name__)


def generation_params(ctx: NodeContext, seed: int = 0) -> Any:
    from p2prl.rl.engine import GenerationParams

    g = ctx.g.generation
    return GenerationParams(
        max_new_tokens=int(g.get("max_new_tokens", 8)),
        temperature=int(g.get("temperature_milli", 1000)) / 1000,
        top_p=int(g.get("top_p_milli", 1000)) / 1000,
        seed=seed,
    )


def group_size(ctx: NodeContext) -> int:
    return int(ctx.g.generation.get("group_size", 8))


def groups_per_batch(ctx: NodeContext) -> int:
    return int(ctx.g.generation.get("groups_per_batch", 8))


def task_of(ctx: NodeContext) -> Any:
    """The genesis task (a plugin one too); a task this machine cannot build stops the node clearly."""
    from p2prl.rl.tasks import get_task

    t = ctx.g.task
    name = str(t.get("name", "addition"))
    try:
        task = get_task(name, **dict(t.get("params") or {}))
    except ValueError as e:
        raise NodeStartError(f"genesis task: {e}") from e
    ctx.status.set(task=name, task_source=f"{type(task).__module__}:{type(task).__qualname__}")
    return task


def genesis_base_hash(ctx: NodeContext) -> str:
    return str(ctx.g.model.get("weights_hash", ""))


def load_start(ctx: NodeContext, weights_dir: Path) -> tuple[Any, Any, Weights]:
    """The model object, tokenizer and the weights to start from: saved ones if valid, else the base.

    The base model must hash to genesis' ``model.weights_hash``; if this machine builds it
    differently, it still starts from it as version 0 but marks it unverified (hash ""), so the
    first sync takes the slow path from an anchor instead of trusting a patch base it does not have.
    """
    if ctx.g.model.get("source", "builtin") != "builtin":
        raise ValueError(f"unsupported model source {ctx.g.model.get('source')!r}")
    model, tok, base = load_base_model(ctx.config.model_cache_dir)
    saved = load_saved_weights(weights_dir)
    if saved is not None:
        log.info("resuming from saved weights v%d (%s)", saved.version, saved.hash[:12])
        ctx.status.incr("restarts_resumed")
        return model, tok, saved
    h = weights_hash(base)
    if h != genesis_base_hash(ctx):
        log.warning(
            "local base model hash %s differs from genesis %s; will sync from an anchor",
            h[:12],
            genesis_base_hash(ctx)[:12],
        )
        ctx.status.incr_label("warnings", "base_hash_mismatch")
        return model, tok, Weights(0, "", base)
    return model, tok, Weights(0, h, base)


@dataclass
class SyncedRole:
    """What a role that follows the trainer's chain starts with (miners and validators alike)."""

    dir: Path
    book: ManifestBook
    engine: Any  # p2prl.rl.engine.HFEngine
    tok: Any
    start: Weights

    @property
    def weights_dir(self) -> Path:
        return self.dir / "weights"


def open_synced_role(ctx: NodeContext, name: str) -> SyncedRole:
    """The role's data directory, its manifest book, an engine and the weights to start from."""
    from p2prl.rl.engine import HFEngine

    d = ctx.data_dir / name
    d.mkdir(parents=True, exist_ok=True)
    book = ManifestBook(ctx.network_id, ctx.genesis.trainer_key, d / "manifests")
    model, tok, start = load_start(ctx, d / "weights")
    return SyncedRole(d, book, HFEngine(model, tok), tok, start)
