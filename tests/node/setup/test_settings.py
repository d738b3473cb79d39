"""Each role's settings record: the part of NodeConfig it reads, every default stated once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.settings import (
    MinerSettings,
    ModelSettings,
    RoleSettings,
    TrainerSettings,
    ValidatorSettings,
    role_settings,
)

RECORDS = (ModelSettings, RoleSettings, MinerSettings, ValidatorSettings, TrainerSettings)


@pytest.mark.parametrize("cls", RECORDS)
def test_a_settings_record_states_no_default(cls: type) -> None:
    """A default here would be a second home for one of NodeConfig's."""
    for f in dataclasses.fields(cls):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name


@pytest.mark.parametrize(
    ("role", "cls"), [("miner", MinerSettings), ("validator", ValidatorSettings), ("trainer", TrainerSettings)]
)
def test_each_role_gets_its_own_record_read_from_the_config(tmp_path: Path, role: str, cls: type) -> None:
    cfg = NodeConfig(role=role, data_dir=tmp_path, fetch_timeout_s=7.5, model=tmp_path / "m", device="cpu")
    s = role_settings(cfg)
    assert type(s) is cls and s.role == role and s.data_dir == tmp_path and s.fetch_timeout_s == 7.5
    assert s.model == ModelSettings(tmp_path / "m", cfg.model_cache_dir, "cpu", cfg.engine, False, False)
    for f in dataclasses.fields(cls):
        if f.name != "model":
            assert getattr(s, f.name) == getattr(cfg, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.fetch_timeout_s = 1.0  # type: ignore[misc]


def test_no_role_sees_another_roles_knobs(tmp_path: Path) -> None:
    miner = role_settings(NodeConfig(role="miner", data_dir=tmp_path))
    assert not hasattr(miner, "lr") and not hasattr(miner, "score_window") and not hasattr(miner, "listen")
    trainer = role_settings(NodeConfig(role="trainer", data_dir=tmp_path))
    assert not hasattr(trainer, "max_batches") and not hasattr(trainer, "s3_bucket")
