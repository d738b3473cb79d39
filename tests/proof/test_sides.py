"""Which side a miner took where its token is not the validator's pick (``proof.sides``): a key
that steers those choices toward reward fails hard within a few batches, though each batch stays
inside the rungs' counts; an honest key's record stays at even odds."""

from __future__ import annotations

import dataclasses
import math
from itertools import count

import numpy as np
import pytest
from proofkit import GROUP, MH, MINER, PARAMS, POSITION_SECRET, VERSION, World

from p2prl.bench.attacks import Ctx, steer_in_margin
from p2prl.bench.proof import ModelSetup
from p2prl.proof.sides import Off, SideRecord
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import HFEngine
from p2prl.rl.sampling import sample_key, uniforms
from p2prl.rl.tasks import get_task

# each rung's rate as a calibration on vLLM's reference batches measured them (tests/proof/test_sampling_check.py)
VLLM_RATES = (7e-4, 7e-4, 3e-3, 1.2e-2)


def test_a_record_at_even_odds_never_fails_and_a_run_of_wins_does() -> None:
    alpha = math.log(1e-9)
    rec = SideRecord(window=256, capacity=4)
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):  # an honest key: each decided side a fair coin, 5,000 sides each
        won = int(rng.binomial(5, 0.5))
        worst = min(worst, rec.add(b"honest", won, 5 - won))
    assert worst > math.log(1e-4)
    wins = 0
    while rec.log_sf(b"steer") >= alpha:  # a key whose every decided side pays
        rec.add(b"steer", 1, 0)
        wins += 1
    assert wins == 30  # 2^-30 < 1e-9 < 2^-29
    # the window halves both counts: a key that won 200 of 256 long ago and then 0 of 64 passes
    rec.add(b"old", 200, 56)
    assert rec.log_sf(b"old") < alpha
    assert rec.add(b"old", 0, 64) > alpha
    for key in (b"a", b"b", b"c", b"d"):  # a key forgotten by the LRU starts from nothing
        rec.add(key, 1, 0)
    assert rec.get(b"steer") == (0.0, 0.0)


def test_a_rollout_continued_with_its_own_uniforms_is_the_rollout(world: World) -> None:
    """What a side is judged against: the validator's continuation from a position with the rollout's
    uniforms. From a position of an honest rollout it is that rollout's rest, token for token."""
    p = world.mine(indices=(40, 41))
    rows, us, want = [], [], []
    for g in p.batch.groups:
        for ri, r in enumerate(g.rollouts):
            ids = r.completion_ids.tolist()
            t = len(ids) // 2
            u = uniforms(sample_key(MH, MINER, g.index, ri), PARAMS.max_new_tokens)
            rows.append(g.prompt_ids.tolist() + ids[:t])
            us.append(np.concatenate([u[t:], np.full(t, 0.5)]))
            want.append(ids[t:])
    got = HFEngine(world.model, world.tok, return_hidden=False).generate_rows(rows, np.stack(us), PARAMS)
    # exact with AVX-512 kernels; with AVX2's a padded batch rounds a token otherwise now and then
    same = sum(s.completion_ids[: len(w)] == w for w, s in zip(want, got, strict=True))
    assert same >= 0.75 * len(rows), (same, len(rows))


def _steering_ctx(world: World, first: int) -> Ctx:
    """The steering attacker of ``bench cheats`` against one validator at a vLLM network's margin, on
    ``digit-start`` (a random model earns it on a fair share of samples; the first token decides)."""
    task = get_task("digit-start", digits=1)
    setup = ModelSetup("small", world.model, world.tok, task, PARAMS, world.other)
    cfg = dataclasses.replace(world.config, sampling_margin=0.05, sampling_rung_rates=VLLM_RATES)
    starts = count(first, 16)

    def indices() -> list[int]:
        k = next(starts)
        return list(range(k, k + 16))

    ctx = Ctx(setup, world.model, VERSION, MH, MINER, cfg, indices, GROUP)
    from p2prl.proof.validate import RolloutValidator

    judge = RolloutValidator.for_model(world.model, world.tok, task, VERSION, MH, config=cfg, position_secret=POSITION_SECRET)
    return dataclasses.replace(ctx, judge=judge)


def test_positions_beyond_honest_reach_are_judged_farthest_first_however_dense_the_drift(world: World) -> None:
    """Past ``side_reach`` of the margin lies what honest rounding did not reach in calibration: such
    positions are judged after the misses, the farthest first, even where the rest are too dense to
    be (a steering key cannot hide choices beyond honest reach among honest drift, nor pass the
    density limit by adding neutral ones); the tiers depend on the distances alone."""
    m = 0.04
    v = world.validator(config=dataclasses.replace(world.config, sampling_margin=m, side_checks=4, side_dense=0.05))
    blob = "cd" * 32
    miss = [Off(0, 0, 1, 2 * m)]
    wide = [Off(1, 0, t, m * (0.3 + 0.1 * t)) for t in range(5)]  # past a quarter of the margin
    near = [Off(2, r, t, m * 0.2) for r in range(4) for t in range(25)]  # 100 off of 1,000: dense
    got = v.pick_sides(blob, miss + near + wide, 1000)
    assert got == sorted(miss + sorted(wide, key=lambda o: -o.distance)[:3])
    got = v.pick_sides(blob, near[:10] + wide[:1], 1000)  # not dense: the wide one, then 3 of the rest
    assert len(got) == 4 and wide[0] in got and set(got) - {wide[0]} <= set(near[:10])
    assert v.pick_sides(blob, near, 1000) == []  # dense, none beyond reach: nothing judged


@pytest.mark.slow  # a lookahead generation at every choice: minutes with AVX2's kernels, where the
@pytest.mark.timeout(1800)  # default model is not exact and honest off positions dilute the sides judged
def test_steering_toward_reward_inside_the_rungs_fails_hard_within_a_few_batches(world: World) -> None:
    """The budgeted steering attacker (only as many steered tokens per batch as each rung allows)
    passes the per-batch counts, but every side it took that decided a reward paid: its record
    passes 1e-9 within a few batches and that batch fails hard as ``sampling``. Before it did, each
    batch was accepted."""
    ctx = _steering_ctx(world, 600)
    outcomes = []
    for _ in range(24):
        out = steer_in_margin(ctx, budgeted=True)
        outcomes.append(out)
        if out.hard:
            break
    caught = outcomes[-1]
    assert caught.hard and set(caught.reasons) == {R.SAMPLING}, caught.reasons
    assert all(not o.hard and o.accepted == o.n for o in outcomes[:-1])
    assert sum(o.extra["side_won"] for o in outcomes) >= 30
    assert sum(o.extra["side_lost"] for o in outcomes) <= 2  # a side honest rounding lost, at most
    assert ctx.judge is not None and ctx.judge.sides.log_sf(MINER) < math.log(1e-9)


def test_an_honest_key_met_batch_after_batch_keeps_an_even_record(world: World) -> None:
    """The same validator and margin meeting in turn the batches of an honest miner whose engine
    rounds otherwise (the model in float32, the validator's in bf16): its tokens are now and then not
    the validator's picks, those sides are judged, and its record never comes near failing; every
    batch accepted."""
    import copy

    from p2prl.proof.miner import mine_batch

    ctx = _steering_ctx(world, 700)
    assert ctx.judge is not None
    f32 = HFEngine(copy.deepcopy(world.model).float(), world.tok)
    judged = 0
    for _ in range(6):
        p = mine_batch(f32, ctx.setup.task, VERSION, MH, MINER, ctx.indices(), GROUP, PARAMS)
        v = ctx.judge.check(p.announcement, MINER, p.blob, VERSION)
        assert not v.hard_failure and v.accepted_rollouts == p.batch.n_rollouts, v.reasons()
        judged += v.stats.side_judged
    assert judged > 0
    assert ctx.judge.sides.log_sf(MINER) > math.log(1e-3)


def test_where_honest_drift_is_dense_the_sides_are_not_judged(world: World) -> None:
    """More positions off the validator's picks than ``side_dense`` of the checked tokens (and than
    ``side_checks``): the few it could judge would be lost among honest drift, each at the cost of a
    generation, so none is."""
    import copy

    from p2prl.proof.miner import mine_batch

    ctx = _steering_ctx(world, 800)
    assert ctx.judge is not None
    ctx.judge.config = dataclasses.replace(ctx.judge.config, side_checks=1, side_dense=0.0)
    f32 = HFEngine(copy.deepcopy(world.model).float(), world.tok)
    dense = 0
    for _ in range(4):
        p = mine_batch(f32, ctx.setup.task, VERSION, MH, MINER, ctx.indices(), GROUP, PARAMS)
        v = ctx.judge.check(p.announcement, MINER, p.blob, VERSION)
        assert not v.hard_failure
        if v.stats.side_positions > 1:
            dense += 1
            assert v.stats.side_judged == 0
        else:
            assert v.stats.side_judged == v.stats.side_positions
    assert dense > 0


def test_misses_are_judged_first_and_however_dense_the_drift(world: World) -> None:
    """A miss (beyond the margin) is a choice honest rounding seldom makes, so it is judged whatever
    the rest: first, and even where the positions off are too dense for the others to be judged (a
    steering key cannot hide its misses among honest drift)."""
    v = world.validator(config=dataclasses.replace(world.config, side_checks=8, side_dense=0.05))
    blob = "ab" * 32
    far = [Off(0, 0, t, 1.0) for t in range(3)]  # beyond the margin
    near = [Off(1, r, t, 1e-4) for r in range(4) for t in range(25)]  # 100 off of 1,000 checked: dense
    assert v.pick_sides(blob, far + near, 1000) == far
    few = near[:20]  # 23 off of 1,000: not dense; the misses, then 5 of the rest
    got = v.pick_sides(blob, far + few, 1000)
    assert len(got) == 8 and set(far) <= set(got) and set(got) - set(far) <= set(few)
    many = [Off(2, 0, t, 1.0) for t in range(12)]  # more misses than side_checks: 8 of them
    got = v.pick_sides(blob, many + near, 1000)
    assert len(got) == 8 and set(got) <= set(many)
    assert v.pick_sides(blob, many + near, 1000) == got  # the secret fixes the pick


@pytest.mark.slow  # a lookahead generation at every choice: minutes with AVX2's kernels, where the
@pytest.mark.timeout(1800)  # default model is not exact and honest off positions dilute the sides judged
def test_steering_with_the_misses_a_batch_may_hold_fails_hard_too(world: World) -> None:
    """The misses the sampling check allows a batch (5 of ~500 tokens at rate 1e-4), each spent on a
    likely token that pays wherever its interval lies, were accepted in every batch (×1.19 at node
    defaults on the default model); the misses are judged first, so the key's record fails it within
    a few batches."""
    ctx = _steering_ctx(world, 900)
    outcomes = []
    for _ in range(12):
        outcomes.append(steer_in_margin(ctx, budgeted=True, misses=True))
        if outcomes[-1].hard:
            break
    assert outcomes[-1].hard and set(outcomes[-1].reasons) == {R.SAMPLING}, outcomes[-1].reasons
    assert sum(o.extra["side_won"] for o in outcomes) >= 30
    assert all(o.accepted == o.n for o in outcomes[:-1])
