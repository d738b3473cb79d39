"""Who a reason is charged to: a copy to whoever's uniforms it does not follow (never to the miner
whose uniforms produced it), and an unlikely group to its miner's luck only when its tokens follow
their uniforms (otherwise the miner chose them, and a soft drop at will would be free)."""

from __future__ import annotations

import dataclasses
import math

import torch
from proofkit import GROUP, MH, MINER, OTHER_MINER, VERSION, World, retarget

from p2prl.proof.batch import build_batch
from p2prl.proof.miner import announce
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import Sample, teacher_forced
from p2prl.rl.tasks import derive_seed


def _reprove(world: World, key: bytes, groups: list) -> object:
    """``(index, prompt, completions, rewards)`` per group, proved by the right model, announced."""
    out = []
    for index, prompt, comps, rewards in groups:
        samples = []
        for ids in comps:
            lp, h = teacher_forced(world.model, prompt, ids)
            samples.append(Sample(prompt, ids, lp.tolist(), h))
        out.append((index, prompt, samples, rewards))
    return announce(build_batch(VERSION, MH, key, out))


def _seq_logprob(world: World, prompt: list[int], ids: list[int]) -> float:
    lp, _ = teacher_forced(world.model, prompt, ids)
    return float(lp.sum())


def test_copy_front_running_charges_the_copier_not_the_victim(world: World) -> None:
    """The attacker copies one of the victim's unlikely completions into its own batch for the same
    problem, where the validator does not recompute it, and gets judged first: the victim's honest
    batch then repeats content another key had first. It follows the victim's uniforms, so it is
    the victim's draw: accepted. (Before: ``copied``, hard, the victim's window zeroed.)"""
    sampled = dataclasses.replace(world.config, checked_per_group=1, checked_tokens=0)
    w = dataclasses.replace(world, config=sampled)
    victim = w.mine(indices=(80, 81), seed=3)
    # the victim's least likely completion: a copy of it cannot be told from a draw by its likelihood
    g0 = victim.batch.groups[0]
    prompt = g0.prompt_ids.tolist()
    lps = [_seq_logprob(world, prompt, r.completion_ids.tolist()) for r in g0.rollouts]
    src = g0.rollouts[min(range(GROUP), key=lps.__getitem__)]
    assert min(lps) < math.log(w.config.copy_max_prob), lps
    v = w.validator()
    attacker_index = retarget(world, g0.index, OTHER_MINER)
    honest = w.mine(key=OTHER_MINER, indices=(attacker_index,), seed=4).batch.groups[0]
    for j in range(GROUP):  # the copy where the validator will not look (3 placements in 4)
        comps = [r.completion_ids.tolist() for r in honest.rollouts]
        rewards = [r.reward for r in honest.rollouts]
        comps[j], rewards[j] = src.completion_ids.tolist(), src.reward
        attack = _reprove(world, OTHER_MINER, [(attacker_index, prompt, comps, rewards)])
        if j not in v._sampled(attack.announcement.blob.id, 0, GROUP):
            break
    first = v.check(attack.announcement, OTHER_MINER, attack.blob, VERSION)
    assert not first.hard_failure  # the premise: the copy was not recomputed
    second = v.check(victim.announcement, MINER, victim.blob, VERSION)
    assert {g.reason for g in second.groups} == {R.OK}, second.reasons()
    assert not second.hard_failure and second.accepted_rollouts == victim.batch.n_rollouts

    # judged in the usual order, the copy is the copier's: it does not follow OTHER_MINER's uniforms
    v = w.validator()
    assert not v.check(victim.announcement, MINER, victim.blob, VERSION).hard_failure
    again = v.check(attack.announcement, OTHER_MINER, attack.blob, VERSION)
    assert again.groups[0].reason == R.COPIED and again.hard_failure


def _unlikely(world: World, prompt: list[int], n: int) -> list[int]:
    """The least likely token at each of ``n`` steps (never a special)."""
    comp: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = world.model(input_ids=torch.tensor([prompt + comp])).logits[0, -1].float()
            comp.append(int(torch.argmin(logits[3:])) + 3)
    return comp


def test_a_group_dropped_at_will_is_a_hard_failure(world: World) -> None:
    """A miner puts unlikely tokens into a group it wants gone (it rewards nothing, or holds an index
    it would rather skip): they are not its uniforms' draws, so the drop is ``sampling``, hard.
    (Before: ``distribution``, soft: 12 of 12 chosen groups dropped with no penalty.)"""
    p = world.mine(indices=tuple(range(90, 98)), seed=11)
    groups = []
    for x in p.batch.groups:
        pids = x.prompt_ids.tolist()
        comps = [r.completion_ids.tolist() for r in x.rollouts]
        rewards = [r.reward for r in x.rollouts]
        if x is p.batch.groups[0]:
            comps[0] = _unlikely(world, pids, 3)
            problem = world.task.problem(derive_seed(MH, MINER, x.index))
            rewards[0] = world.task.reward(problem, world.tok.decode(comps[0]))
        groups.append((x.index, pids, comps, rewards))
    q = _reprove(world, MINER, groups)
    verdict = world.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.groups[0].reason == R.SAMPLING and verdict.hard_failure


def test_honest_bad_luck_stays_soft(world: World) -> None:
    """Honest groups whose tokens the test finds unlikely (alpha raised so that chance drops some)
    follow their uniforms: each is dropped as ``distribution``, and no batch fails hard."""
    cfg = dataclasses.replace(world.config, distribution_alpha=0.05, distribution_batch_alpha=1e-300)
    w = dataclasses.replace(world, config=cfg)
    v = w.validator()
    drops = 0
    for k in range(4):
        p = w.mine(indices=tuple(range(200 + 8 * k, 208 + 8 * k)), seed=k)
        verdict = v.check(p.announcement, MINER, p.blob, VERSION)
        assert not verdict.hard_failure, verdict.reasons()
        assert set(verdict.reasons()) <= {R.OK, R.DISTRIBUTION}
        drops += verdict.reasons().get(R.DISTRIBUTION, 0)
    assert drops > 0  # the test saw bad luck at all
