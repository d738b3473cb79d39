"""The trainer's own check of every token it trains on: does it follow its public uniform?

Validators recompute only a sample of each batch's rollouts (2 of 8 per group with long completions),
so a rollout nobody recomputed could carry any tokens. The trainer computes the distribution of every
token it trains on anyway (the GRPO forward), so it checks each one against the uniform that had to
pick it (``rl.sampling``: the sample key follows from the version's manifest hash, the miner's key,
the prompt index and the sample index, all in the group) and against the behaviour logprob the miner
reported. A token whose uniform lies more than ``margin`` outside its interval under the trainer's
distribution (or whose behaviour logprob is more than the logprob gap from the trainer's) is not
trained on; a rollout with more uniform misses than honest drift explains is dropped and its miner
reported (``RolloutCheck``). The logprob gap is not counted as proof: it grows with honest drift.

The trainer's model is a few versions newer than the rollout's and fp32 where the miner's is bf16,
so its intervals sit a little off the miner's: by at most the total variation between the two
distributions at that position. ``margin`` is therefore loose (a payload of fabricated tokens misses
its uniforms by far more, at nearly every position: an unlikely token's interval is narrow, and
its uniform lands anywhere in [0, 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2prl.rl.sampling import interval_distance, sample_key, token_intervals, uniforms
from p2prl.rl.types import RolloutGroup

VOCAB_ELEMS = 1 << 22  # logits turned into float64 CDFs at once (32 MiB)


def group_uniforms(group: RolloutGroup) -> list[np.ndarray | None]:
    """Each rollout's public uniforms, or None for all when the group does not say whose they are
    (groups a local run made itself: no manifest hash, miner key or prompt index)."""
    if not group.manifest_hash or group.index < 0 or len(group.miner) != 64:
        return [None] * len(group.rollouts)
    try:
        key = bytes.fromhex(group.miner)
    except ValueError:
        return [None] * len(group.rollouts)
    return [
        uniforms(sample_key(group.manifest_hash, key, group.index, j), len(r.completion_ids))
        for j, r in enumerate(group.rollouts)
    ]


def uniform_distances(logits: Any, tokens: Any, u: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """How far each token's uniform lies outside its inverse-CDF interval under ``logits`` ``[N, V]``
    (0 inside), computed in slices of ``VOCAB_ELEMS`` logits."""
    import torch

    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    step = max(1, VOCAB_ELEMS // max(1, logits.shape[-1]))
    out = []
    with torch.no_grad():
        for s in range(0, logits.shape[0], step):
            lo, hi = token_intervals(logits[s : s + step].detach(), tokens[s : s + step], temperature, top_p)
            out.append(interval_distance(lo, hi, u[s : s + step]))
    return np.concatenate(out) if out else np.zeros(0)


@dataclass(frozen=True)
class RolloutCheck:
    """When a rollout's tokens do not follow: ``misses`` tokens of ``n`` beyond the margin, more
    than ``miss_rate`` explains at ``alpha`` (a binomial bound). An honest rollout
    misses at most where the trainer's model has drifted from the miner's far enough to move an
    interval edge past its uniform by ``margin``, rarely; a fabricated one at nearly every token."""

    miss_rate: float = 5e-3
    alpha: float = 1e-6

    def fails(self, misses: int, n: int) -> bool:
        return misses > 0 and binom_log_sf(misses, n, self.miss_rate) < math.log(self.alpha)


def binom_log_sf(k: int, n: int, p: float) -> float:
    """log P(X ≥ k) for X ~ Binomial(n, p), summed in log space."""
    if k <= 0:
        return 0.0
    if k > n or p <= 0:
        return -math.inf
    if p >= 1:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, min(n, k + 200) + 1)
    ]
    m = max(terms)
    return m + math.log(sum(math.exp(t - m) for t in terms))
