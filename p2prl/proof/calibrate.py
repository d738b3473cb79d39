"""Tolerances from measured honest drift: how far this engine's own KV-cache generation, at two
batch sizes, lands from the validator's full forward pass, times a safety factor, above a floor.

Honest drift depends on the model and the engines (it is exactly 0 for the default tiny model on
CPU, ~2.4% of the hidden state for the 24M configuration), so a network fixes its tolerances from a
calibration like this one and publishes them; a fixed number would either accept quantized models
of small networks or reject honest miners of large ones.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from p2prl.proof.miner import mine_batch
from p2prl.proof.validate import RolloutValidator, ValidatorConfig
from p2prl.rl import HFEngine

CAL_MINER = b"\xca" * 32
# where the engine is not exact (its KV-cache states differ from the full forward's), the sampling
# margin is a maximum over at least this many checked tokens, mined for at most MORE_S seconds more
MIN_TOKENS = 8192
MORE_S = 30.0
# a per-rollout bound is reached by one honest rollout in this many (the tail fitted beyond the top decile)
TAIL_RARITY = 1e7


def tail_level(x: Sequence[float], rarity: float = TAIL_RARITY, top: float = 0.1, min_n: int = 40) -> float:
    """The level one honest value in ``rarity`` exceeds, from an exponential tail fitted to the
    values beyond the sample's top ``top`` share (peaks over a threshold: with ``k`` values above ``u``
    and mean excess ``σ``, P(X > u + t) = k/n · e^(-t/σ); σ at two standard errors above its estimate).
    A per-rollout maximum (a rollout's largest logprob error, its rms fingerprint error over 24
    positions) is long-tailed: the largest of a few hundred calibration rollouts says little about
    the largest of 10⁶. 0 below ``min_n`` values."""
    v = np.sort(np.asarray(x, dtype=np.float64))
    n = len(v)
    if n < min_n:
        return 0.0
    k = max(10, int(n * top))
    u = float(v[n - k - 1])
    sigma = float(np.mean(v[n - k :] - u)) * (1.0 + 2.0 / math.sqrt(k))  # its upper bound: k values estimate it
    return u + sigma * math.log(k * rarity / n)


def rung_rates(d: np.ndarray, margin: float, rungs: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """Each rung's honest rate from calibration's distances ``d``: the share of uniforms that lay more
    than ``margin * rung`` outside their intervals, at its upper confidence bound (count + 3√count + 3,
    so a rung never seen past still allows 3 in ``len(d)``), times ``factor`` for drift over training,
    at most 1."""
    n = max(1, len(d))
    out = []
    for f in rungs:
        c = int(np.count_nonzero(d > margin * f))
        out.append(min(1.0, factor * (c + 3.0 * math.sqrt(c) + 3.0) / n))
    return tuple(out)


def calibrate(
    model: Any,
    tokenizer: Any,
    task: Any,
    params: Any,
    manifest_hash: str,
    base: ValidatorConfig,
    n_prompts: int | None = None,
    group_size: int | None = None,
    factor: float = 2.0,
    max_factor: float = 4.0,
    fp_floor: float = 0.006,
    fp_rollout_floor: float = 0.05,
    lp_floor: float = 0.05,
    lp_max_floor: float = 0.5,
    sampling_floor: float = 0.002,
    min_tokens: int = MIN_TOKENS,
    more_s: float = MORE_S,
    early: Callable[[ValidatorConfig], None] | None = None,
    other_engines: Sequence[Callable[[int], Any]] = (),
) -> tuple[ValidatorConfig, dict[str, float]]:
    """``base`` with fingerprint and logprob tolerances set from honest drift; returns the measurement.

    The batch's fingerprint quantile and the mean logprob error average hundreds of values and vary
    little from one batch to the next, so ``factor`` times the worst of a few batches bounds them.
    The per-rollout bounds (a rollout's rms fingerprint error, its largest per-token logprob error)
    are maxima over one rollout: the largest of a few hundred calibration rollouts says little about
    a long run's (measured: 0.318 honest against 0.397 at factor 2 on the 24M model; on SmolLM2-135M
    5,120 honest rollouts reached a fingerprint rms of 0.048 and a logprob error of 0.52 against
    0.051 and 0.57 from ``factor`` and ``max_factor`` times calibration's worst), so each is also at
    least the level one honest rollout in ``TAIL_RARITY`` reaches by the tail fitted to calibration's
    rollouts (``tail_level``). That fit holds a tail like an exponential's (a rollout's largest
    logprob error: 0.59 there). A rollout's plain rms on that model was a mixture whose tail ~370
    rollouts do not show (one to three positions parted from the full forward, up to 0.14 against the
    others' 0.015: the fit said 0.046, under the 0.048 seen), so a rollout's fingerprint statistic
    leaves out its largest eighth of positions (``recompute.trimmed_rms``; 2,560 honest rollouts:
    worst 0.028, calibration's fit 0.038). A lie the looser logprob bound
    lets through is bounded by the trainer anyway (``GRPOConfig.max_logprob_gap``, dual clipping); a
    cheaper model's states are caught by the batch's fingerprint quantile.

    The sampling check's margin is the farthest an honest token's uniform lay outside its interval
    (the engine's logits against the full forward's), a long-tailed maximum, times ``max_factor``,
    above ``sampling_floor``: 0 on the default model (margin 0.002), ≈ 0.026 on the 24M one, whose
    honest drift is dense (margin ≈ 0.10, past the farthest a vLLM miner's uniform lay, 0.095), where
    a temperature-0.8 sampler still misses by more than that at 1% of its tokens and a
    temperature-0.6 one at 15% (docs/PROOF.md).

    The floors hold where calibration sees no drift at all (every node on one engine, as in the
    demo): ``fp_floor`` (0.006) bounds the batch's 90th-percentile per-position fingerprint error, above
    one bf16 step (2⁻⁸ ≈ 0.004) and below the default model's cheaper copies (int8 ≥ 0.0058 per group);
    ``fp_rollout_floor`` (0.05) bounds one rollout's rms, above the 0.016–0.030 that one honest
    position rounded the other way gives a 1–4-token rollout and below another model's ≈ 0.14;
    ``lp_floor`` / ``lp_max_floor`` (0.05 / 0.5) bound the logprob errors left after the per-token bf16
    rounding allowance (``recompute.rounding_allowance``), gross lies only: what a lie below them can do
    is bounded by the trainer.

    ``early``: given the tolerances of the first two batches before more are mined, so a validator
    judges with them meanwhile instead of the genesis's loose ones (a cheat's batch judged during
    those seconds was accepted).

    ``other_engines``: engines that mine the reference batches besides this model's transformers
    engine, each given the batch size. A validator of miners on other engines (vLLM) mines them
    with each of those too, so the tolerances measure every pair that meets — each engine's rollouts
    against this validator's forward — and hold the loosest: every run is mined by every engine, the
    margin is the farthest any engine's uniform lay, each rung's rate the highest of any engine's,
    and more batches are mined until every engine has ``min_tokens`` checked."""
    gen = base.generation
    n_prompts = n_prompts or (min(gen.groups_per_batch, 16) if base.fixed_group_count else 4)
    group_size = group_size or gen.group_size
    loose = dataclasses.replace(
        base,
        fingerprint_tol=1.0,
        fingerprint_tol_rollout=1.0,
        logprob_tol_mean=1e9,
        logprob_tol_max=1e9,
        sampling_alpha=0.0,
        # its own batches: n_prompts groups of group_size
        generation=dataclasses.replace(gen, group_size=group_size, groups_per_batch=n_prompts),
    )
    worst = {"fp_quantile": 0.0, "fp_rollout": 0.0, "lp_max": 0.0, "sampling_misses": 0.0, "sampling_dist": 0.0}
    worst |= {"fp_rollout_tail": 0.0, "lp_max_tail": 0.0}
    factories = [lambda bs: HFEngine(model, tokenizer, max_batch=bs), *other_engines]
    dists: list[list[np.ndarray]] = [[] for _ in factories]  # per engine
    per_rollout: list[tuple[list[float], list[float]]] = [([], []) for _ in factories]  # fp, lp max
    counted = [0] * len(factories)
    tokens = 0  # the fewest any engine has had checked

    def tolerances() -> ValidatorConfig:
        margin = max(sampling_floor, max_factor * worst["sampling_dist"])
        rates = [rung_rates(np.concatenate(d) if d else np.zeros(0), margin, base.sampling_rungs, factor) for d in dists]
        return dataclasses.replace(
            base,
            fingerprint_tol=max(fp_floor, factor * worst["fp_quantile"]),
            fingerprint_tol_rollout=max(fp_rollout_floor, factor * worst["fp_rollout"], worst["fp_rollout_tail"]),
            logprob_tol_mean=max(lp_floor, factor * worst["lp_max"] / 2),
            logprob_tol_max=max(lp_max_floor, max_factor * worst["lp_max"], worst["lp_max_tail"]),
            sampling_margin=margin,
            sampling_rung_rates=tuple(max(r) for r in zip(*rates, strict=True)),
        )

    def runs() -> Any:
        """A whole batch in one engine call (as a miner makes it) and one row at a time, each judged
        the way a live batch is (only the picked rollouts recomputed, so the forward's rows differ);
        then, on an engine that is not exact, whole batches until ``min_tokens`` were checked: a
        rounding difference moves an interval edge past the margin once in ~10³ tokens (the default
        model with AVX2 kernels: 56 of 77,390 tokens beyond 0.002, farthest 0.013), which two
        batches seldom see and a live run's thousands of batches do."""
        yield group_size * n_prompts, 8, 0
        yield 1, 7, 0
        # another engine's drift can be rare (another CPU's kernels: a token in ~10³), so two batches
        # without any say nothing: with other engines, mine on to min_tokens whatever they showed
        def mine_more() -> bool:
            return bool(other_engines) or bool(worst["fp_quantile"] or worst["sampling_dist"])

        if early is not None and mine_more() and tokens < min_tokens:
            early(tolerances())
        deadline = time.monotonic() + more_s
        first = n_prompts
        while tokens < min_tokens and time.monotonic() < deadline and mine_more():
            yield group_size * n_prompts, 8, first  # other prompts: other uniforms
            first += n_prompts

    for bs, seed, first in runs():
        for e, make in enumerate(factories):
            p = mine_batch(
                make(bs),
                task,
                0,
                manifest_hash,
                CAL_MINER,
                list(range(first, first + n_prompts)),
                group_size,
                dataclasses.replace(params, seed=seed),
            )
            v = RolloutValidator.for_model(model, tokenizer, task, 0, manifest_hash, config=loose)
            s = v.check(p.announcement, CAL_MINER, p.blob, 0).stats
            worst["fp_quantile"] = max(worst["fp_quantile"], s.fingerprint_err_quantile)
            worst["fp_rollout"] = max(worst["fp_rollout"], s.fingerprint_err_max)
            worst["lp_max"] = max(worst["lp_max"], s.logprob_err_max)
            worst["sampling_misses"] = max(worst["sampling_misses"], s.sampling_misses)
            worst["sampling_dist"] = max(worst["sampling_dist"], s.sampling_dist_max)
            counted[e] += s.sampling_tokens
            fps, lps = per_rollout[e]
            fps += s.rollout_fp
            lps += s.rollout_lp_max
            worst["fp_rollout_tail"] = max(worst["fp_rollout_tail"], tail_level(fps))
            worst["lp_max_tail"] = max(worst["lp_max_tail"], tail_level(lps))
            if s.sampling_dists is not None:
                dists[e].append(s.sampling_dists)
        tokens = min(counted)
    worst["sampling_tokens"] = float(sum(counted))
    return tolerances(), worst
