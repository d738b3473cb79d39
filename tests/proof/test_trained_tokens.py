"""Nothing trains the policy that nobody verified: a validator recomputes only a sample of each group,
so a payload in a rollout it did not recompute is accepted; the trainer's own token check (every
trained token against its public uniform, ``rl.verify``) leaves it out of the step and names its key."""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from proofkit import GENERATION, GROUP, MH, MINER, PARAMS, POSITION_SECRET, VERSION, World

from p2prl.proof.batch import build_batch
from p2prl.proof.miner import announce, mine_batch
from p2prl.proof.validate import RolloutValidator
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import HFEngine, Sample, teacher_forced
from p2prl.rl.grpo import GRPOConfig, GRPOTrainer
from p2prl.rl.tasks import get_task

TASK = get_task("digit-start", digits=1)  # rewards a completion starting with a digit
PAYLOAD = "7zq#zq#z"  # starts with a digit: rewarded; the model would never sample it
INDICES = list(range(60, 64))


def _validator(world: World) -> RolloutValidator:
    # one rollout of each group recomputed (the long-completion regime: 2 of 8), no token target
    cfg = replace(world.config, checked_per_group=1, checked_tokens=0)
    # a fixed position secret: with a random one, all four placements were recomputed once in 256
    return RolloutValidator.for_model(
        world.model, world.tok, TASK, VERSION, MH, config=cfg, position_secret=POSITION_SECRET
    )


def _payload_batch(world: World, v: RolloutValidator):
    """An honest batch with the payload, proved by the right model, in a rollout ``v`` will not
    recompute (a miner who tries gets there 3 times in 4; the test finds the placement at once)."""
    honest = mine_batch(HFEngine(world.model, world.tok), TASK, VERSION, MH, MINER, INDICES, GROUP, PARAMS)
    ids = world.tok.encode(PAYLOAD)
    lp, h = teacher_forced(world.model, honest.batch.groups[0].prompt_ids.tolist(), ids)
    for j in range(GROUP):
        groups = []
        for gi, g in enumerate(honest.batch.groups):
            prompt = g.prompt_ids.tolist()
            samples, rewards = [], []
            for ri, r in enumerate(g.rollouts):
                comp = ids if (gi, ri) == (0, j) else r.completion_ids.tolist()
                lps, hid = (lp, h) if (gi, ri) == (0, j) else teacher_forced(world.model, prompt, comp)
                samples.append(Sample(prompt, comp, lps.tolist(), hid))
                rewards.append(1.0 if (gi, ri) == (0, j) else r.reward)
            groups.append((g.index, prompt, samples, rewards))
        p = announce(build_batch(VERSION, MH, MINER, groups))
        if j not in v._sampled(p.announcement.blob.id, 0, GROUP):
            return p, j
    raise AssertionError("unreachable: one of four placements is unrecomputed")


def _payload_logprob(model, prompt: list[int], ids: list[int]) -> float:
    with torch.no_grad():
        x = torch.tensor([prompt + ids])
        logits = model(input_ids=x).logits[0, len(prompt) - 1 : -1].float()
        return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).sum())


def _train(world: World, groups, **cfg) -> tuple[GRPOTrainer, float]:
    torch.manual_seed(0)
    t = GRPOTrainer(copy.deepcopy(world.model).float(), GRPOConfig(lr=3e-3, **cfg), pad_id=0)
    prompt, ids = groups[0].prompt_ids, world.tok.encode(PAYLOAD)
    before = _payload_logprob(t.model, prompt, ids)
    rejected = []
    for step in range(3):  # each step the model moves on: the groups are that much staler
        gs = copy.deepcopy(groups)
        for g in gs:
            g.extra["staleness"] = step
        t.step(gs)
        rejected += t.rejected
    t.rejected = rejected
    return t, _payload_logprob(t.model, prompt, ids) - before


def test_payload_in_an_unrecomputed_rollout_is_not_trained_on(world: World) -> None:
    v = _validator(world)
    p, j = _payload_batch(world, v)
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert {g.reason for g in verdict.groups} == {R.OK}  # the validator cannot see it: the premise
    groups = verdict.valid_groups
    assert groups[0].rollouts[j].completion_ids == world.tok.encode(PAYLOAD)

    _, rise_unchecked = _train(world, groups, verify_margin=0.0)  # the check off: today's trainer
    assert rise_unchecked > 5.0, rise_unchecked  # the attack works where nothing checks the tokens

    t, rise = _train(world, groups)
    assert {(r.miner, r.index, r.sample) for r in t.rejected} == {(MINER.hex(), INDICES[0], j)}
    assert rise < 0.5, (rise, rise_unchecked)


def test_honest_groups_train_whole_and_stale_ones_too(world: World) -> None:
    """Every honest token follows its uniform under the trainer's fp32 model, and under a model a few
    steps newer (the buffer holds groups up to max_staleness versions old)."""
    honest = mine_batch(
        HFEngine(world.model, world.tok), TASK, VERSION, MH, MINER, list(range(70, 78)), GROUP, PARAMS
    )
    verdict = RolloutValidator.for_model(
        world.model, world.tok, TASK, VERSION, MH, config=world.config, position_secret=POSITION_SECRET
    ).check(
        honest.announcement, MINER, honest.blob, VERSION
    )
    groups = verdict.valid_groups
    assert len(groups) == 8
    t = GRPOTrainer(copy.deepcopy(world.model).float(), GRPOConfig(lr=1e-3), pad_id=0)
    for stale in range(GENERATION.max_new_tokens // 2):
        gs = copy.deepcopy(groups)
        for g in gs:
            g.extra["staleness"] = stale
        stats = t.step(gs)
        assert not t.rejected and stats["unverified_frac"] < 0.05, (stale, stats)
