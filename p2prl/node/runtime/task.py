"""What every role builds from the genesis besides its weights: the task and the generation settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2prl.node.runtime.assets import AssetError, task_data_file
from p2prl.node.runtime.role import NodeStartError, RoleEnv
from p2prl.node.setup.settings import RoleSettings
from p2prl.protocol import GenerationSpec
from p2prl.rl import GenerationParams, get_task

if TYPE_CHECKING:
    from p2prl.rl import Task


def generation_params(env: RoleEnv[RoleSettings], seed: int = 0) -> GenerationParams:
    return params_of(env.g.generation, seed)


def params_of(g: GenerationSpec, seed: int = 0) -> GenerationParams:
    """The engines' sampling settings from the genesis's generation section."""
    return GenerationParams(
        max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, seed=seed
    )


def task_of(env: RoleEnv[RoleSettings]) -> Task:
    """The genesis task (a plugin one too); a task this machine cannot build stops the node clearly."""
    t = env.g.task
    params = dict(t.params)
    try:
        if t.data_sha256:  # the data file travels as a genesis asset: this node's copy, or fetched
            params["path"] = str(task_data_file(env, t.data_sha256, str(params.get("path", ""))))
        task = get_task(t.name, **params)
    except (ValueError, AssetError) as e:
        raise NodeStartError(f"genesis task: {e}") from e
    env.status.set(task=t.name, task_source=f"{type(task).__module__}:{type(task).__qualname__}")
    return task
