"""The validator's flat recomputation agrees with the per-rollout definitions it replaces."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from proofkit import MH, World

from p2prl.proof.fingerprint import SKETCH_DIM, differences, relative_error, sketch
from p2prl.proof.recompute import (
    Job,
    fisher_log_pvalues,
    iter_rollout_stats,
    token_chunks,
    token_scores,
    trimmed_rms,
)
from p2prl.proof.validate import fisher_log_pvalue
from p2prl.rl import sample_key, uniforms
from p2prl.rl.engine import processed_logprobs, teacher_forced
from p2prl.rl.sampling import token_intervals


def test_token_chunks_respect_the_budget() -> None:
    lengths = [3, 9, 4, 4, 20, 1, 1]
    runs = token_chunks(lengths, 16)
    assert [i for r in runs for i in r] == list(range(len(lengths)))  # in order, each once
    for r in runs:
        padded = len(r) * max(lengths[i] for i in r)
        assert padded <= 16 or len(r) == 1  # a longer sequence alone
    assert token_chunks([], 16) == []
    assert token_chunks([5] * 4, 1000) == [range(4)]


def test_fisher_vectorized_matches_the_scalar_definition() -> None:
    rng = np.random.default_rng(0)
    segs = [np.log(rng.uniform(1e-4, 1, size=n)) for n in (1, 2, 7, 30, 64)]
    segs += [np.zeros(3), np.log(np.full(20, 1e-2))]
    got = fisher_log_pvalues(np.array([s.sum() for s in segs]), np.array([s.size for s in segs]))
    want = [fisher_log_pvalue(s) for s in segs]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    # one tail probability: the p-value is the tail itself; none: nothing to reject
    assert fisher_log_pvalues(np.array([math.log(1e-3), 0.0]), np.array([1, 0])) == pytest.approx(
        [math.log(1e-3), 0.0]
    )


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_token_scores_slicing_changes_nothing(temperature: float, top_p: float) -> None:
    """One softmax a slice gives what each definition gives: the sampled distribution's logprob, the
    pick's own intervals bit for bit (``token_intervals``), the tail over the temperature-scaled
    distribution; slicing the rows changes nothing."""
    torch.manual_seed(0)
    logits = torch.randn(37, 50) * 3
    targets = np.random.default_rng(1).integers(0, 50, size=37)
    targets[:5] = logits[:5].argmax(-1).numpy()  # greedy's intervals: [0, 1) for these
    whole = token_scores(logits, targets, temperature, top_p)
    sliced = token_scores(logits, targets, temperature, top_p, vocab_elems=50 * 4)  # 4 tokens at a time
    for a, b in zip(dataclasses.astuple(whole), dataclasses.astuple(sliced), strict=True):
        np.testing.assert_array_equal(a, b)
    t = temperature or 1.0
    ref = processed_logprobs(logits, t, top_p).gather(1, torch.as_tensor(targets)[:, None])
    np.testing.assert_allclose(whole.logprob, ref.squeeze(1).double().numpy(), atol=1e-5)
    lo, hi = token_intervals(logits, targets, temperature, top_p)
    np.testing.assert_array_equal(whole.lo, lo)
    np.testing.assert_array_equal(whole.hi, hi)
    p = torch.softmax(logits.double() / t, -1)
    p_x = p.gather(1, torch.as_tensor(targets)[:, None])
    tail = (p * (p <= p_x * (1 + 1e-6))).sum(-1).log().numpy()
    np.testing.assert_allclose(whole.log_tail, tail, rtol=0, atol=1e-12)
    assert np.all(whole.log_tail <= 1e-9)  # log of a probability
    if temperature == 0:
        assert np.all(whole.hi[:5] == 1.0) and np.all(whole.lo == 0.0)


def test_rollout_stats_match_one_teacher_forced_pass_per_rollout(world: World) -> None:
    """Honest rollouts recomputed together (padded, several forward chunks) give the statistics that a
    separate teacher-forced pass per rollout gives."""
    p = world.mine(indices=(60, 61, 62), batch=4)
    jobs, refs = [], []
    for g in p.batch.groups:
        for r in g.rollouts:
            n = len(r.completion_ids)
            pos = np.arange(n)[::2]
            jobs.append(Job(g.prompt_ids, r.completion_ids, r.logprobs, r.sketches, pos))
            lp, h = teacher_forced(world.model, g.prompt_ids.tolist(), r.completion_ids.tolist())
            d = differences(r.sketches[pos], sketch(h[pos], MH))
            refs.append((lp.double().numpy(), trimmed_rms(np.sqrt((d * d).mean(1)))))
            assert refs[-1][1] <= relative_error(r.sketches[pos], sketch(h[pos], MH)) + 1e-12
    stats = list(iter_rollout_stats(world.model, jobs, MH, SKETCH_DIM, 1.0, 1.0, forward_tokens=40))
    assert len(stats) == len(jobs)
    for job, st, (lp, fp) in zip(jobs, stats, refs, strict=True):
        assert st["n_tails"] == len(job.completion_ids) and st["fp_n"] == len(job.positions) * SKETCH_DIM
        assert st["seq_logprob"] == pytest.approx(float(lp.sum()), abs=0.05)
        assert st["fp_rollout"] == pytest.approx(fp, abs=0.02)
        assert st["lp_max"] < 0.1 and st["fp_rollout"] < 0.05  # honest
        assert st["dist_logp"] <= 0.0 and st["log_tail_sum"] <= 0.0


def test_a_rollouts_fingerprint_rms_leaves_out_its_largest_eighth() -> None:
    """One position rounded the other way no longer sets a short rollout's rms; an error at every
    position (another model) is untouched, and the statistic never exceeds the plain rms."""
    honest = np.array([0.015, 0.06])  # two positions, one rounded the other way
    assert trimmed_rms(honest) == pytest.approx(0.015)
    assert math.sqrt(np.mean(honest**2)) > 0.04  # the plain rms: near the real model's bound
    other = np.full(24, 0.14)
    assert trimmed_rms(other) == pytest.approx(0.14)
    e = np.linspace(0.01, 0.2, 24)
    kept = np.sort(e)[:21]  # 24 // 8 = 3 left out
    assert trimmed_rms(e) == pytest.approx(math.sqrt(np.mean(kept**2)))
    assert trimmed_rms(np.array([0.03])) == pytest.approx(0.03) and trimmed_rms(np.zeros(0)) == 0.0
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.exponential(0.02, rng.integers(1, 65))
        assert trimmed_rms(x) <= math.sqrt(np.mean(x**2)) + 1e-15


def test_a_logit_one_bf16_step_apart_is_within_the_rounding_allowance() -> None:
    """Two engines may round a large logit to neighbouring bf16 values: at |z| in [8, 16) one step is
    0.0625, more than a fixed per-token floor of 0.05 allowed. The allowance covers one step of the
    target's logit and one of the largest; a claim three steps off is still an error."""
    from p2prl.proof.recompute import rounding_allowance

    z = torch.zeros(1, 16, dtype=torch.bfloat16)
    z[0, 3], z[0, 7] = 10.0, 12.0  # the target is not the likeliest token
    shifted = z.clone()
    shifted[0, 3] = z[0, 3] + 0.0625  # the next bf16 value above 10
    assert shifted[0, 3].float().item() == 10.0625
    targets = np.array([3])
    honest = token_scores(z.float(), targets, 1.0, 1.0).logprob
    other = token_scores(shifted.float(), targets, 1.0, 1.0).logprob
    diff = abs(float(other[0] - honest[0]))
    allow = rounding_allowance(z.float(), targets, 1.0)
    assert diff > 0.05  # a fixed floor of 0.05 would reject this honest token
    assert diff <= allow[0] == pytest.approx(0.125)
    assert allow[0] < 3 * 0.0625  # three steps off exceeds it
    assert rounding_allowance(z.float(), targets, 0.5)[0] == pytest.approx(0.25)  # over the temperature


def test_a_float32_forward_is_the_float32_models_bit_for_bit(world: World) -> None:
    """``float32=True`` recomputes from the bf16 weights upcast for the call: the statistics of a
    float32 copy of the model exactly, and no second opinion is asked for (it would be the same)."""
    assert next(world.model.parameters()).dtype == torch.bfloat16
    p = world.mine(indices=(63, 64), batch=4)
    batch = p.batch
    jobs = [
        Job(g.prompt_ids, r.completion_ids, r.logprobs, r.sketches, np.arange(len(r.completion_ids)),
            uniforms(sample_key(batch.prompt_seed, batch.miner, g.index, ri), len(r.completion_ids)))
        for g in batch.groups
        for ri, r in enumerate(g.rollouts)
    ]
    f32 = copy.deepcopy(world.model).float()
    asked: list[int] = []

    def recheck(st: dict[str, object]) -> bool:
        asked.append(1)
        return True

    args = (jobs, MH, SKETCH_DIM, 0.7, 0.9, 64)
    ours = list(iter_rollout_stats(world.model, *args, recheck=recheck, float32=True))
    ref = list(iter_rollout_stats(f32, *args))
    assert not asked and all("float32" not in st for st in ours)
    for a, b in zip(ours, ref, strict=True):
        for k in ("fp_sq", "fp_rollout", "lp_mean", "lp_max", "dist_logp", "seq_logprob"):
            assert a[k] == b[k], k
        assert np.array_equal(a["samp_dist"], b["samp_dist"])
    bf16 = list(iter_rollout_stats(world.model, *args))
    assert any(a["seq_logprob"] != b["seq_logprob"] for a, b in zip(ours, bf16, strict=True))
