"""Calibration: tolerances come from measured honest drift, never below their floors."""

from __future__ import annotations

from proofkit import MH, MINER, PARAMS, VERSION, World

from p2prl.proof.calibrate import calibrate
from p2prl.proof.validate import RolloutValidator
from p2prl.reasons import VerdictReason


def test_calibrated_config_accepts_honest_and_rejects_other_weights(world: World) -> None:
    cfg, drift = calibrate(
        world.model, world.tok, world.task, PARAMS, MH, world.config, n_prompts=2, group_size=4
    )
    assert cfg.fingerprint_tol >= 0.006 and cfg.fingerprint_tol >= 2 * drift["fp_quantile"]
    assert cfg.fingerprint_tol_rollout >= 0.05 and cfg.fingerprint_tol_rollout >= 2 * drift["fp_rollout"]
    assert cfg.logprob_tol_max >= 0.5 and drift["sampling_misses"] == 0
    v = RolloutValidator.for_model(world.model, world.tok, world.task, VERSION, MH, config=cfg)
    honest = world.mine(indices=(50, 51))
    verdict = v.check(honest.announcement, MINER, honest.blob, VERSION)
    assert {g.reason for g in verdict.groups} == {VerdictReason.OK}
    forged = world.mine(model=world.other, indices=(52, 53))
    assert not v.check(forged.announcement, MINER, forged.blob, VERSION).valid_groups
