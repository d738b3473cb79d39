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


# each rung's rate as a calibration on vLLM's reference batches measured them (VLLM_TINY, 8,437 tokens)
VLLM_RATES = (7e-4, 7e-4, 3e-3, 1.2e-2)


def _steered(world: World, indices: list[int], margin: float, every: int) -> object:
    """A miner that, at every ``every``-th position where another token's interval lies within
    ``margin`` of the uniform, takes that token (the neighbour nearest the uniform) instead of the
    honest pick: no uniform ends farther than ``margin`` outside its interval, so no miss."""
    import numpy as np
    import torch

    from p2prl.rl.sampling import pick_tokens, processed_probs, sample_key, uniforms

    groups, seen = [], 0
    for i in indices:
        problem = world.task.problem(derive_seed(MH, MINER, i))
        prompt = world.tok.encode_prompt(problem.prompt)
        samples, rewards = [], []
        for j in range(GROUP):
            u = uniforms(sample_key(MH, MINER, i, j), PARAMS.max_new_tokens)
            out: list[int] = []
            while len(out) < PARAMS.max_new_tokens and not (out and out[-1] in world.tok.stop_ids):
                with torch.no_grad():
                    logits = world.model(input_ids=torch.tensor([prompt + out])).logits[0, -1:].float()
                pick = int(pick_tokens(logits, u[len(out) : len(out) + 1], 1.0, 1.0)[0])
                p = processed_probs(logits, 1.0, 1.0)[0].double()
                hi = (p.cumsum(0) / p.sum()).numpy()
                lo = hi - (p / p.sum()).numpy()
                d = np.maximum(0.0, np.maximum(lo - u[len(out)], u[len(out)] - hi))
                near = [t for t in np.argsort(d) if t != pick and 0 < d[t] <= margin * 0.9 and p[t] > 0]
                if near:
                    seen += 1
                    if seen % every == 0:
                        pick = int(near[0])
                out.append(pick)
            samples.append(Sample(prompt, out, [], None))
            rewards.append(world.task.reward(problem, world.tok.decode(out)))
        groups.append((i, prompt, samples, rewards))
    return _prove(world, groups)


def test_steering_inside_the_margin_fails_hard_though_nothing_misses(world: World) -> None:
    """With a margin as wide as a vLLM network's (0.05) a miner may take a neighbouring token wherever
    its interval lies within the margin of the uniform and never miss. Taking it at every third such
    position puts far more uniforms outside their intervals than the rates inside the margin allow
    (here those a calibration on vLLM's reference batches measured, docs/PROOF.md): the batch fails
    hard as ``sampling``. The honest miner, judged alike, passes."""
    cfg = dataclasses.replace(world.config, sampling_margin=0.05, sampling_rung_rates=VLLM_RATES)
    idx = list(range(120, 136))
    p = _steered(world, idx, 0.05, every=3)
    v = world.validator(config=cfg).check(p.announcement, MINER, p.blob, VERSION)
    assert v.stats.sampling_misses == 0 and v.stats.sampling_dist_max <= 0.05
    assert v.hard_failure and set(v.reasons()) == {R.SAMPLING}, v.reasons()
    honest = world.mine(indices=tuple(idx))
    v = world.validator(config=cfg).check(honest.announcement, MINER, honest.blob, VERSION)
    assert not v.hard_failure and len(v.valid_groups) == len(idx)


def test_the_rungs_fail_a_batch_only_beyond_their_honest_rates() -> None:
    """``rung_log_sf`` is the binomial tail of each rung's count at its rate: a count an honest
    engine makes passes, the same distances at four times the count do not."""
    import math

    import numpy as np

    from p2prl.proof.validate import ValidatorConfig, rung_counts, rung_log_sf
    from p2prl.protocol import GenerationSpec

    cfg = ValidatorConfig(generation=GenerationSpec(), sampling_margin=0.05)
    d = np.zeros(1000)
    assert rung_log_sf(d, cfg) == 0.0 and rung_counts(d, cfg) == [0, 0, 0, 0]
    d[:2] = 0.03  # past rung 0 (0.025) at rate 0.002: 2 in 1000 is what honest numerics give
    d[2:30] = 0.004  # past rung 3 (0.003125) at rate 0.2
    assert rung_counts(d, cfg) == [2, 2, 2, 30]
    log_alpha = math.log(cfg.sampling_alpha / len(cfg.sampling_rungs))
    assert rung_log_sf(d, cfg) > log_alpha
    d[30:40] = 0.03  # 12 past rung 0: P(Binomial(1000, 0.002) >= 12) ≈ 1e-5 ... still passes
    assert rung_log_sf(d, cfg) > log_alpha
    d[40:60] = 0.03  # 32 past rung 0: beyond what honest rounding makes at 1e-9
    assert rung_log_sf(d, cfg) < log_alpha
