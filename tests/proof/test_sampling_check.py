"""The validator's check of verifiable sampling: a miner whose tokens do not follow their public
uniforms fails hard (``sampling``), whatever proofs it attaches; an honest miner never does."""

from __future__ import annotations

import dataclasses

from proofkit import GROUP, MH, MINER, PARAMS, VERSION, World

from p2prl.proof.batch import build_batch
from p2prl.proof.miner import announce, sample_keys
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import HFEngine, Sample, teacher_forced
from p2prl.rl.tasks import derive_seed


def _groups(world: World, indices: list[int], n: int, params, keys) -> list:
    tok = world.tok
    problems = [world.task.problem(derive_seed(MH, MINER, i)) for i in indices]
    prompts = [tok.encode_prompt(p.prompt) for p in problems]
    out = HFEngine(world.model, tok).generate(prompts, n, params, keys)
    return [
        (i, prompt, grp, [world.task.reward(p, tok.decode(s.completion_ids)) for s in grp])
        for i, p, prompt, grp in zip(indices, problems, prompts, out, strict=True)
    ]


def _prove(world: World, groups: list) -> object:
    """Honest T=1 logprobs and hidden states of the right model for whatever tokens were chosen."""
    proved = []
    for i, prompt, samples, rewards in groups:
        ss = []
        for s in samples:
            lp, h = teacher_forced(world.model, prompt, s.completion_ids)
            ss.append(Sample(prompt, s.completion_ids, lp.tolist(), h))
        proved.append((i, prompt, ss, rewards))
    return announce(build_batch(VERSION, MH, MINER, proved))


def _judge(world: World, p) -> object:
    return world.validator().check(p.announcement, MINER, p.blob, VERSION)


def test_honest_batch_passes_with_every_token_checked(world: World) -> None:
    p = world.mine(indices=tuple(range(100, 108)))
    v = _judge(world, p)
    assert not v.hard_failure and len(v.valid_groups) == 8
    assert v.stats.sampling_tokens > 100 and v.stats.sampling_misses == 0


def test_sharpened_sampler_with_honest_proofs_fails_hard(world: World) -> None:
    idx = list(range(110, 118))
    for change in ({"temperature": 0.5}, {"top_p": 0.5}, {"temperature": 0.0}):
        params = dataclasses.replace(PARAMS, **change)
        p = _prove(world, _groups(world, idx, GROUP, params, sample_keys(MH, MINER, idx, GROUP)))
        v = _judge(world, p)
        assert v.hard_failure and not v.valid_groups, change
        assert R.SAMPLING in v.reasons(), (change, v.reasons())


def test_a_redrawn_batch_fails_hard(world: World) -> None:
    """Drawing the batch with any randomness but the public uniforms (to keep the best of N) fails."""
    idx = list(range(120, 128))
    for seed in (1, 2):
        p = _prove(world, _groups(world, idx, GROUP, dataclasses.replace(PARAMS, seed=seed), None))
        v = _judge(world, p)
        assert v.hard_failure and R.SAMPLING in v.reasons()


def test_picked_samples_fail_hard(world: World) -> None:
    """Keeping the best GROUP of 2·GROUP samples drawn from the public uniforms renumbers them."""
    idx = list(range(130, 138))
    groups = _groups(world, idx, 2 * GROUP, PARAMS, sample_keys(MH, MINER, idx, 2 * GROUP))
    kept = []
    for i, prompt, samples, rewards in groups:
        order = sorted(range(len(samples)), key=lambda j: (-rewards[j], len(samples[j].completion_ids), -j))
        kept.append((i, prompt, [samples[j] for j in order[:GROUP]], [rewards[j] for j in order[:GROUP]]))
    v = _judge(world, _prove(world, kept))
    assert v.hard_failure and R.SAMPLING in v.reasons()
