"""``bench.attacks`` on the proof tests' small model: each attack runs and is judged as the table
reports it (a group dropped at will fails hard, copy front-running leaves the victim accepted, the
best of several keys is accepted with its gain reported)."""

from __future__ import annotations

import dataclasses
from itertools import count

from proofkit import GROUP, MH, MINER, OTHER_MINER, VERSION, World

from p2prl.bench.attacks import Ctx, copy_front_running, key_grinding, soft_drop, steer_in_margin
from p2prl.bench.proof import ModelSetup
from p2prl.rl.engine import GenerationParams


def _ctx(world: World, first: int) -> Ctx:
    setup = ModelSetup("small", world.model, world.tok, world.task, GenerationParams(8, 1.0), world.other)
    starts = count(first, 2)
    cfg = dataclasses.replace(world.config, checked_per_group=1, checked_tokens=0)

    def indices() -> list[int]:
        k = next(starts)
        return [k, k + 1]

    return Ctx(setup, world.model, VERSION, MH, MINER, cfg, indices, GROUP)


def test_attacks_run_and_are_judged(world: World) -> None:
    ctx = _ctx(world, 300)
    # every rollout recomputed, as the node's defaults do for short completions (with one of them, the
    # validator's random position secret decides whether the unlikely rollout is looked at at all)
    out = soft_drop(dataclasses.replace(ctx, config=dataclasses.replace(ctx.config, checked_per_group=GROUP)))
    assert out.hard and out.accepted == 0, out.reasons
    out = copy_front_running(ctx, OTHER_MINER)
    assert not out.hard and out.accepted == out.n, out
    out = key_grinding(ctx, keys=3)  # accepted (a validator cannot tell), but each kept batch costs the rest
    assert not out.hard and out.accepted == out.n and out.gain is not None
    assert out.extra["reward_gain"] >= 1.0 and out.extra["batches_of_work"] == 5
    assert out.gain <= out.extra["reward_gain"] / 5 + 1e-12  # one trained batch for five of work
    out = steer_in_margin(dataclasses.replace(ctx, config=dataclasses.replace(ctx.config, sampling_margin=0.0)))
    assert out.gain == 1.0 and out.accepted == out.n  # no margin, no choice: the honest draw


def test_the_batched_lookahead_continues_each_candidate_as_one_row_would(world: World) -> None:
    """The steering attacker's lookahead completes every candidate in one batch: a row alone gives the
    same tokens as completing it alone; in a batch each row continues its own candidate (a batch's
    kernels may round a row otherwise on another CPU, so only the shape is asserted there)."""
    from p2prl.bench.attacks import _complete, _complete_many
    from p2prl.rl.sampling import sample_key, uniforms

    ctx = _ctx(world, 400)
    prompt = world.tok.encode_prompt("3+4=")
    u = uniforms(sample_key(MH, MINER, 400, 0), 8)
    prefix = _complete(ctx, prompt, [], u)[:2]
    firsts = [5, 6, 7, 8]
    for c in firsts:
        assert _complete_many(ctx, prompt, prefix, [c], u) == [_complete(ctx, prompt, [*prefix, c], u)]
    stop = set(world.tok.stop_ids)
    for c, row in zip(firsts, _complete_many(ctx, prompt, prefix, firsts, u), strict=True):
        assert row[: len(prefix) + 1] == [*prefix, c] and len(row) <= 8
        assert not stop & set(row[len(prefix) : -1])  # nothing after its stop token
