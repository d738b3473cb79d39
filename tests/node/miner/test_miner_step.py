"""The miner's between-batch decision (``node.miner.next_step``): numbers in, a step out."""

from __future__ import annotations

from p2prl.node.miner.miner import IDLE_REFILL_S, Step, next_step

BASE = dict(
    batches=3, max_batches=0, made=0, per_version=2, idle_s=0.0, verified=True, behind=0, max_staleness=4
)


def step(**kw: object) -> Step:
    return next_step(**{**BASE, **kw})  # type: ignore[arg-type]


def test_a_synced_miner_under_its_quota_makes_a_batch() -> None:
    assert step() == Step()
    assert step(made=1, behind=4) == Step()  # four versions behind is still within the bound


def test_quota_reached_waits_and_tops_up_after_the_refill_interval() -> None:
    assert step(made=2, idle_s=1.0) == Step(0.2, "waiting")
    assert step(made=4, idle_s=1.0) == Step(0.2, "waiting")
    assert step(made=2, idle_s=IDLE_REFILL_S) == Step()  # the trainer may need more: one more batch
    assert step(made=3, idle_s=1.0) == Step()  # a top-up started: not a multiple of the quota
    assert step(made=9, per_version=0) == Step()  # no quota


def test_unverified_or_too_stale_weights_make_nothing() -> None:
    assert step(verified=False) == Step(0.5, "behind")
    assert step(behind=5) == Step(0.5, "behind")


def test_max_batches_stops_production_before_anything_else() -> None:
    assert step(max_batches=3, verified=False) == Step(1.0)
    assert step(max_batches=4) == Step()
