"""The validator's recomputation: one batched teacher-forced forward over many rollouts, and from it
every per-rollout statistic the checks need.

Everything after the forward runs on the flat axis of all completion tokens at once and is reduced per
rollout with segment sums: on small models a per-rollout Python loop costs more than the forward
itself. Work over the vocabulary is done in slices of at most ``vocab_elems`` logits, so a large
vocabulary never makes the validator hold ``tokens x vocab`` doubles at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2prl.proof.fingerprint import differences, sketch

VOCAB_ELEMS = 1 << 22  # logits processed at once in float64 (32 MiB)
TRIM_SHARE = 8  # a rollout's fingerprint rms leaves out its largest 1/TRIM_SHARE of positions
# The network's weights and logits are bf16: an element's rounding step is 2^-7 of its binade.
BF16_EPS = 2.0**-7


@dataclass(frozen=True)
class Job:
    """One rollout to recompute: its prompt and completion, what the miner claimed, where to look."""

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray  # behaviour logprobs the miner reported, [n]
    sketches: np.ndarray  # the miner's sketches, [n, m]
    positions: np.ndarray  # completion positions whose sketches are compared
    uniforms: np.ndarray | None = None  # the public sampling uniforms of its tokens [n] (rl.sampling)


def token_chunks(lengths: Sequence[int], budget: int) -> list[range]:
    """Consecutive runs of sequences whose padded size (rows x longest) stays within ``budget``
    tokens (a single longer sequence gets a run of its own)."""
    runs, start, width = [], 0, 0
    for i, n in enumerate(lengths):
        w = max(width, n)
        if i > start and (i - start + 1) * w > budget:
            runs.append(range(start, i))
            start, w = i, n
        width = w
    if start < len(lengths):
        runs.append(range(start, len(lengths)))
    return runs


def forward_flat(
    model: Any, seqs: Sequence[tuple[np.ndarray, np.ndarray]], float32: bool = False
) -> tuple[Any, Any]:
    """One right-padded full forward (no cache). Returns the float32 last hidden states ``[N, d]`` and
    logits ``[N, V]`` at the positions that produced each completion token, all sequences concatenated
    in order (``N`` = total completion tokens). ``float32``: computed in float32 from the model's
    (bf16) weights, which stay as they are (``in_float32``)."""
    import torch

    dev = next(model.parameters()).device
    lens = [len(p) + len(c) for p, c in seqs]
    ids = torch.zeros((len(seqs), max(lens)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows, cols = [], []
    for i, (p, c) in enumerate(seqs):
        ids[i, : lens[i]] = torch.as_tensor(np.concatenate([p, c]).astype(np.int64))
        mask[i, : lens[i]] = 1
        rows.append(np.full(len(c), i))
        cols.append(np.arange(len(p) - 1, len(p) - 1 + len(c)))
    r = torch.as_tensor(np.concatenate(rows)).to(dev)
    c = torch.as_tensor(np.concatenate(cols)).to(dev)
    base, head = model.base_model, model.get_output_embeddings()
    call = in_float32 if float32 else _plain
    with torch.no_grad():
        h = call(base, input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
        hs = h.last_hidden_state[r, c]
        logits = call(head, hs)
    return hs.float().cpu(), logits.float().cpu()


def _plain(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def in_float32(module: Any, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` computed in float32 from its weights (bf16 ones upcast exactly, for
    this call only: the module's own tensors are not touched)."""
    import torch

    params = dict(module.named_parameters())
    if all(p.dtype == torch.float32 for p in params.values()):
        return module(*args, **kwargs)
    return torch.func.functional_call(module, {n: p.float() for n, p in params.items()}, args, kwargs)


@dataclass(frozen=True)
class TokenScores:
    """Per completion token, what the checks read from the validator's logits (float64 arrays)."""

    logprob: np.ndarray  # the target's log-probability under the sampled distribution (T, top-p)
    log_tail: np.ndarray  # log P(a token no likelier than the target), temperature-scaled, no top-p
    lo: np.ndarray  # the interval [lo, hi) of u whose inverse CDF picks the target (rl.sampling)
    hi: np.ndarray


def token_scores(
    logits: Any,
    targets: np.ndarray,
    temperature: float,
    top_p: float,
    vocab_elems: int = VOCAB_ELEMS,
    top_p_slack: float = 0.0,
) -> TokenScores:
    """The target's log-probability under the sampled distribution (temperature, top-p), its log tail
    probability under the temperature-scaled distribution (no top-p: that only makes honest tokens look
    likelier, so the test stays conservative) and its inverse-CDF interval (temperature 0: greedy,
    [0, 1) for the argmax and empty otherwise), all from one float64 softmax per slice of rows.
    ``top_p_slack``: a target whose mass before it is under ``top_p`` plus this is kept by the cut (a
    miner's logits a rounding step off ours put it inside its own cut).

    The intervals are ``rl.sampling``'s own (``apply_top_p``, ``intervals_of``, ``greedy_intervals``):
    bit for bit the pick's numbers. One softmax serves all three where three used to run
    (SmolLM2-135M: a third of a batch's check was these passes over the 49,152-token vocabulary)."""
    import torch

    # torch, as above: importing proof/ costs none
    from p2prl.rl import apply_top_p, greedy_intervals, intervals_of

    t = temperature if temperature > 0 else 1.0
    tgt = torch.as_tensor(targets.astype(np.int64))[:, None]
    step = max(1, vocab_elems // max(1, logits.shape[1]))
    parts: list[tuple[Any, Any, Any, Any]] = []
    for s in range(0, logits.shape[0], step):
        lg, tg = logits[s : s + step], tgt[s : s + step]
        z = lg.double()
        if t != 1.0:  # x / 1 is x: the pick's softmax(z / T) bit for bit, one pass fewer at T = 1
            z.div_(t)
        probs = torch.softmax(z, dim=-1)
        q = apply_top_p(probs, top_p, tg.squeeze(1) if top_p_slack > 0 else None, top_p_slack)
        lo, hi = intervals_of(q, tg) if temperature > 0 else greedy_intervals(lg, tg)
        lp = q.gather(1, tg).squeeze(1).log()
        p_x = probs.gather(1, tg)
        # the tail in place: probs (and q, at top-p 1) are spent by now
        tail = probs.masked_fill_(probs > p_x * (1 + 1e-6), 0.0).sum(-1).clamp(min=1e-300).log()
        parts.append((lp, tail, lo, hi))
    if not parts:
        return TokenScores(*(np.zeros(0) for _ in range(4)))
    return TokenScores(*(torch.cat(col).numpy() for col in zip(*parts, strict=True)))


def rounding_allowance(logits: Any, targets: np.ndarray, temperature: float) -> np.ndarray:
    """Per token, how far an honest logprob may sit from ours through bf16 rounding of the logits alone:
    one rounding step of the target's logit plus one of the largest logit (which bounds how far the
    normaliser moves), over the temperature.

    Two engines whose fp32 sums differ in the last bits round a logit to neighbouring bf16 values now
    and then; a step is 2⁻⁷ of the logit's binade, so 0.0625 at |z| in [8, 16), more than a fixed
    per-token floor of 0.05 allowed (measured: ~1 token in 1,000 of a trained default model differs,
    by up to 0.37 of this allowance; docs/PROOF.md). The allowance scales with the logits a model
    actually produces, so it needs no calibration and gives a liar no more than two rounding steps."""
    import torch

    t = temperature if temperature > 0 else 1.0
    z = logits.float()
    zi = z.gather(1, torch.as_tensor(targets.astype(np.int64))[:, None]).squeeze(1).abs()
    zmax = z.abs().amax(1) if z.shape[0] else zi

    def step(x: Any) -> Any:
        _, e = torch.frexp(x.clamp(min=1e-30))  # x = m * 2^e with m in [0.5, 1)
        return torch.ldexp(torch.full_like(x, BF16_EPS), e - 1)

    return ((step(zi) + step(zmax)) / t).double().numpy()


def fisher_log_pvalues(log_tail_sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per segment, log P(χ²(2n) ≥ -2 Σ log π) (Fisher's combination of n tail probabilities), from
    each segment's sum of log tails and its count: ``-x/2 + log Σ_{i<n} (x/2)^i / i!``."""
    half = -np.asarray(log_tail_sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.zeros(half.shape)
    live = (half > 0) & (counts > 0)
    if not live.any():
        return out
    n_max = int(counts[live].max())
    i = np.arange(n_max)
    lgam = np.array([math.lgamma(k + 1) for k in range(n_max)])
    terms = i[None, :] * np.log(half[live])[:, None] - lgam[None, :]
    terms = np.where(i[None, :] < counts[live][:, None], terms, -np.inf)
    m = terms.max(1)
    out[live] = -half[live] + m + np.log(np.exp(terms - m[:, None]).sum(1))
    return out


def trimmed_rms(errs: np.ndarray) -> float:
    """The rms of one rollout's per-position fingerprint errors without its largest ``len //
    TRIM_SHARE`` (at least one from two positions on).

    An honest engine now and then parts from the full forward for a few positions running (the
    KV-cache step rounds an element the other way and the next positions carry it): on SmolLM2-135M
    such a burst (up to 0.14 of the state, against about 0.015 elsewhere) set its rollout's plain rms
    (0.048 in 10,240 honest rollouts, the bound 0.051); without the largest eighth the worst of
    2,560 is at 0.028. Another model's state is off at every position (≈ 0.14), so no lie the plain
    rms caught gets through. Never above the plain rms: a bound calibrated on that (an older
    genesis's) stays safe for honest miners."""
    k = len(errs)
    if k == 0:
        return 0.0
    e = np.sort(np.asarray(errs, dtype=np.float64))
    kept = e[: k - max(1, k // TRIM_SHARE)] if k >= 2 else e
    return math.sqrt(float(np.mean(kept * kept)))


def iter_rollout_stats(
    model: Any,
    jobs: Sequence[Job],
    manifest_hash: str,
    sketch_dim: int,
    temperature: float,
    top_p: float,
    forward_tokens: int,
    recheck: Callable[[dict[str, Any]], bool] | None = None,
    top_p_slack: float = 0.0,
    float32: bool = False,
) -> Iterator[dict[str, Any]]:
    """For every job, in order: fingerprint squared error and count (``fp_sq``, ``fp_n``), its rms
    without its largest positions (``fp_rollout``, ``trimmed_rms``), its plain rms (``fp_rms``,
    reported only) and each checked position's rms error (``fp_pos``, an array), mean and max
    absolute logprob error past the rounding allowance, Fisher log p-value of its tokens
    (``dist_logp``) with the log-tail sum and count it came from, its sequence log-probability, and
    for jobs with uniforms how far each token's uniform lies outside the token's inverse-CDF
    interval (``samp_dist``, an array; 0 inside).
    Lazy: each forward of ``forward_tokens`` padded tokens runs when its first result is wanted, so a
    caller that has seen enough stops the model work.

    ``recheck``: the jobs whose statistics it flags (a rollout that looks off) are computed again in
    float32 (``forward_flat(float32=True)``), their statistics under ``"float32"`` beside the model
    precision's, for the caller to judge the rollout by the reference it matches better (both are the
    right model's: they differ by rounding, except where rounding diverges). A bf16 full forward of
    SmolLM2-135M landed 0.43 of the hidden state's norm and 1.6 nats from the float32 one on an honest completion whose miner's bf16 generation was within
    0.05 and 0.12 of it: in bf16 alone the validator's own rounding failed that honest miner
    (docs/PROOF.md, "A float32 second opinion").

    ``float32``: every forward in float32 from the model's weights (``recheck`` is then moot): on a
    CPU without bf16 kernels torch emulates a bf16 matmul at a third of float32's speed."""
    if float32:
        recheck = None
    lengths = [len(j.prompt_ids) + len(j.completion_ids) for j in jobs]
    for run in token_chunks(lengths, forward_tokens):
        part = [jobs[i] for i in run]
        hidden, logits = forward_flat(model, [(j.prompt_ids, j.completion_ids) for j in part], float32=float32)
        stats = _chunk_stats(part, hidden, logits, manifest_hash, sketch_dim, temperature, top_p, top_p_slack)
        again = [i for i, st in enumerate(stats) if recheck is not None and recheck(st)]
        if again:
            sub = [part[i] for i in again]
            h32, l32 = forward_flat(model, [(j.prompt_ids, j.completion_ids) for j in sub], float32=True)
            for i, st in zip(
                again,
                _chunk_stats(sub, h32, l32, manifest_hash, sketch_dim, temperature, top_p, top_p_slack),
                strict=True,
            ):
                stats[i]["float32"] = st
        yield from stats


def _chunk_stats(
    jobs: Sequence[Job],
    hidden: Any,
    logits: Any,
    manifest_hash: str,
    sketch_dim: int,
    temperature: float,
    top_p: float,
    top_p_slack: float = 0.0,
) -> list[dict[str, Any]]:
    n = np.array([len(j.completion_ids) for j in jobs])
    seg = np.repeat(np.arange(len(jobs)), n)
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    # fingerprint at the chosen positions
    k = np.array([len(j.positions) for j in jobs])
    flat_pos = np.concatenate([s + j.positions for s, j in zip(starts, jobs, strict=True)]).astype(np.int64)
    claimed = np.concatenate([j.sketches[j.positions] for j in jobs])
    d = differences(claimed, sketch(hidden[flat_pos], manifest_hash, sketch_dim))
    fp_sq = np.bincount(np.repeat(np.arange(len(jobs)), k), (d * d).sum(1), minlength=len(jobs))
    fp_n = k * sketch_dim
    pos_err = np.sqrt((d * d).mean(1)) if len(d) else np.zeros(0)
    pos_splits = np.split(pos_err, np.cumsum(k)[:-1])
    # logprobs and tails
    targets = np.concatenate([j.completion_ids for j in jobs])
    scores = token_scores(logits, targets, temperature, top_p, top_p_slack=top_p_slack)
    lp, tails = scores.logprob, scores.log_tail
    claimed_lp = np.concatenate([j.logprobs for j in jobs]).astype(np.float64)
    # the error beyond what bf16 rounding of the logits explains: what the tolerances bound
    lp_err = np.maximum(0.0, np.abs(lp - claimed_lp) - rounding_allowance(logits, targets, temperature))
    lp_sum_err = np.bincount(seg, lp_err, minlength=len(jobs))
    lp_max = np.zeros(len(jobs))
    np.maximum.at(lp_max, seg, lp_err)
    tail_sum = np.bincount(seg, tails, minlength=len(jobs))
    dist = fisher_log_pvalues(tail_sum, n)
    seq_lp = np.bincount(seg, lp, minlength=len(jobs))
    samp = _sampling_distances(jobs, scores, starts, n)
    return [
        {
            "fp_sq": float(fp_sq[i]),
            "fp_n": float(fp_n[i]),
            "fp_rollout": trimmed_rms(pos_splits[i]),
            "fp_rms": math.sqrt(fp_sq[i] / fp_n[i]) if fp_n[i] else 0.0,
            "lp_mean": float(lp_sum_err[i] / n[i]) if n[i] else 0.0,
            "lp_max": float(lp_max[i]),
            "dist_logp": float(dist[i]),
            "log_tail_sum": float(tail_sum[i]),
            "n_tails": float(n[i]),
            "seq_logprob": float(seq_lp[i]),
            "fp_pos": pos_splits[i],
            "samp_dist": samp[i],
        }
        for i in range(len(jobs))
    ]


def _sampling_distances(
    jobs: Sequence[Job], scores: TokenScores, starts: np.ndarray, n: np.ndarray
) -> list[np.ndarray | None]:
    """Per job with uniforms: each token's distance from its public uniform to the token's interval
    under this model's processed distribution (``rl.sampling``); None for jobs without uniforms."""
    from p2prl.rl import interval_distance

    out: list[np.ndarray | None] = [None] * len(jobs)
    for i, j in enumerate(jobs):
        if j.uniforms is not None:
            sl = slice(int(starts[i]), int(starts[i] + n[i]))
            out[i] = interval_distance(scores.lo[sl], scores.hi[sl], np.asarray(j.uniforms, dtype=np.float64))
    return out
