"""Each role's typed settings: the part of :class:`NodeConfig` that role reads, and nothing else.

``NodeConfig`` is what an operator writes (defaults, TOML, environment, flags) and holds every
default; these frozen records have no defaults of their own, so a value is stated in one place.
A role is given its record through :class:`p2prl.node.runtime.role.RoleEnv` and cannot read another
role's knobs or the network host's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from p2prl.node.setup.config import NodeConfig


@dataclass(frozen=True)
class ModelSettings:
    """Where the genesis model comes from and what runs it."""

    model: Path | None
    cache_dir: Path
    device: str
    engine: str
    vllm_eager: bool
    vllm_check_weights: bool


@dataclass(frozen=True)
class RoleSettings:
    """What every role reads."""

    role: str
    data_dir: Path
    model: ModelSettings
    fetch_timeout_s: float
    report_weights_sha256: bool


@dataclass(frozen=True)
class MinerSettings(RoleSettings):
    max_batches: int
    batches_per_version: int
    local_network: bool  # what its rejection hints may blame


@dataclass(frozen=True)
class ValidatorSettings(RoleSettings):
    keep_states: int
    checked_per_group: int
    calibrate_tolerances: bool
    forward_float32: bool  # the validator's forward in float32 (CPUs without bf16 kernels)
    reference_engine: str  # own | vllm | hf-avx2: what mines calibration's reference batches besides own
    score_window: int


@dataclass(frozen=True)
class TrainerSettings(RoleSettings):
    lr: float
    train_batch_groups: int
    train_epochs: int
    min_publish_s: float
    keep_versions: int
    max_versions: int
    checkpoint_every: int


_BY_ROLE: dict[str, type[RoleSettings]] = {
    "miner": MinerSettings,
    "validator": ValidatorSettings,
    "trainer": TrainerSettings,
}


def model_settings(cfg: NodeConfig) -> ModelSettings:
    return ModelSettings(
        model=cfg.model,
        cache_dir=cfg.model_cache_dir,
        device=cfg.device,
        engine=cfg.engine,
        vllm_eager=cfg.vllm_eager,
        vllm_check_weights=cfg.vllm_check_weights,
    )


def role_settings(cfg: NodeConfig) -> RoleSettings:
    """The settings record of ``cfg.role``, every field read from ``cfg`` by its one name."""
    cls = _BY_ROLE[cfg.role]
    values: dict[str, Any] = {"model": model_settings(cfg)}
    for f in fields(cls):
        if f.name not in values:
            values[f.name] = getattr(cfg, f.name)
    return cls(**values)
