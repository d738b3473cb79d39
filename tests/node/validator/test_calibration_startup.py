"""Calibrating a validator's tolerances (minutes on a real model) never stops it judging: batches
announced meanwhile are judged with the genesis's tolerances, its status says it is calibrating,
and the calibrated tolerances apply from the next check once ready. A real validator on a real host.
"""

from __future__ import annotations

import threading

import pytest

import p2prl.node.validator.validator as vmod
from p2prl.crypto.keys import Identity
from p2prl.net.gossip import Incoming
from p2prl.net.identity import peer_id_for
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.runtime.task import generation_params, task_of
from p2prl.node.setup.settings import ValidatorSettings
from p2prl.proof.miner import mine_batch
from p2prl.protocol.messages import decode_message, encode_message


def test_batches_judged_while_calibrating(make_net, monkeypatch: pytest.MonkeyPatch) -> None:
    gate, entered = threading.Event(), threading.Event()
    real = vmod.calibrate_tolerances

    def slow_calibration(*a, **kw):  # stands for minutes of calibration on a real model
        entered.set()
        assert gate.wait(120), "the test never released the calibration"
        return real(*a, **kw)

    monkeypatch.setattr(vmod, "calibrate_tolerances", slow_calibration)
    rt = build_runtime(make_net().config("validator", calibrate_tolerances=True))
    made: list[vmod.Validator] = []
    try:
        builder = threading.Thread(target=lambda: made.append(vmod.Validator(rt.env(ValidatorSettings))))
        builder.start()
        builder.join(60)
        released_early = builder.is_alive()
        if released_early:  # it calibrates before judging anything: let it finish, then fail
            gate.set()
            builder.join(120)
        assert not released_early, "the validator judges nothing until it has calibrated"
        (v,) = made
        assert entered.wait(30) and rt.status.snapshot()["calibrating"] is True
        genesis_cfg = v.checker.config
        # the judging loop waits a few seconds for the first calibrated tolerances, then goes on
        assert v._awaiting_first_tolerances()
        monkeypatch.setattr(vmod, "FIRST_TOLERANCES_WAIT_S", 0.0)
        assert not v._awaiting_first_tolerances()

        miner = Identity.generate()
        g = v.env.g.generation
        prep = mine_batch(
            v.engine, task_of(v.env), 0, v.current.hash, miner.public_key,
            list(range(g.groups_per_batch)), g.group_size, generation_params(v.env, seed=0),
        )  # fmt: skip
        env, ann = decode_message(encode_message(miner, v.env.network_id, prep.announcement), v.env.network_id)
        item = Incoming("rollouts", env, ann, peer_id_for(miner), peer_id_for(miner))
        bv = v.check(item, prep.blob)
        assert bv is not None and all(grp.accepted for grp in bv.groups), bv.reasons()
        assert v.checker.config is genesis_cfg  # judged with the genesis's tolerances

        gate.set()
        assert v.wait_calibrated(120)
        assert v.checker.config is not genesis_cfg
        assert rt.status.snapshot()["calibrating"] is False
    finally:
        gate.set()
        rt.net.stop()


def test_tolerances_are_measured_again_as_the_model_trains(make_net, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the version moved ``RECALIBRATE_VERSIONS`` past the last calibration (and enough time
    passed), the judging thread starts another calibration on a copy of the current version; it judges
    with the tolerances it holds meanwhile (never the genesis's) and with the new ones after."""
    rt = build_runtime(make_net().config("validator", calibrate_tolerances=True))
    try:
        v = vmod.Validator(rt.env(ValidatorSettings))
        assert v.wait_calibrated(120)
        first = v.checker.config
        monkeypatch.setattr(vmod, "RECALIBRATE_MIN_S", 0.0)
        monkeypatch.setattr(vmod, "RECALIBRATE_SHARE", 1e9)  # time enough since the last
        v._apply_calibration()  # v0 still: nothing to measure again
        assert not v._calibrating() and rt.status.snapshot()["counters"].get("recalibrations", 0) == 0
        monkeypatch.setattr(vmod, "RECALIBRATE_VERSIONS", 0)  # as if the model had moved on
        v._apply_calibration()
        assert rt.status.snapshot()["counters"]["recalibrations"] == 1
        assert v.checker.config is first  # held while the new ones are measured
        monkeypatch.setattr(vmod, "RECALIBRATE_SHARE", 1e-9)  # from now on the last one is too recent
        assert v.wait_calibrated(120)
        assert v.checker.config is not first
        assert rt.status.snapshot()["gauges"]["calibrated_version"] == 0
        v._apply_calibration()  # the one just done is too recent for this share of the time
        assert not v._calibrating() and rt.status.snapshot()["counters"]["recalibrations"] == 1
    finally:
        rt.net.stop()


@pytest.mark.slow
def test_a_validator_calibrates_on_an_avx2_cpus_reference_batches(make_net, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--reference-engine hf-avx2``: the validator's calibration mines its reference batches with
    AVX2's kernels too (a child process, closed after), and an AVX2 miner's batch on other prompts is
    accepted with the tolerances it holds."""
    from p2prl.node.weights.isa import IsaEngine

    made: list[IsaEngine] = []

    class Recorded(IsaEngine):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            self.calls = 0
            made.append(self)

        def generate(self, *a: object, **kw: object) -> object:
            self.calls += 1
            return super().generate(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(vmod, "IsaEngine", Recorded)
    rt = build_runtime(make_net().config("validator", calibrate_tolerances=True, reference_engine="hf-avx2"))
    try:
        v = vmod.Validator(rt.env(ValidatorSettings))
        assert v.wait_calibrated(300)
        assert len(made) == 1 and made[0].capability == "AVX2" and not made[0].running
        # both runs of its first batches, then more whatever they showed (another CPU's drift is rare)
        assert made[0].calls >= 3
        miner = Identity.generate()
        g = v.env.g.generation
        older = IsaEngine("avx2", v.engine.model, v.engine.tokenizer)
        try:
            prep = mine_batch(
                older, task_of(v.env), 0, v.current.hash, miner.public_key,
                list(range(300, 300 + g.groups_per_batch)), g.group_size, generation_params(v.env, seed=0),
            )  # fmt: skip
        finally:
            older.close()
        env, ann = decode_message(encode_message(miner, v.env.network_id, prep.announcement), v.env.network_id)
        item = Incoming("rollouts", env, ann, peer_id_for(miner), peer_id_for(miner))
        bv = v.check(item, prep.blob)
        assert bv is not None and not bv.hard_failure and all(grp.accepted for grp in bv.groups), bv.reasons()
    finally:
        rt.net.stop()
