"""Verifiable sampling: the sampler's randomness is public, so a miner cannot re-draw a batch or pick
among samples, and a validator can recompute which token each position had to take.

For sample ``j`` of the miner's prompt ``i`` at a version, the *sample key* is
``SHA-256("p2prl/sample/v1" ‖ manifest hash (32 bytes) ‖ miner key (32 bytes) ‖ i (u64 BE) ‖ j (u32 BE))``
and the uniform of completion position ``t`` is the first 8 bytes of ``SHA-256(key ‖ t (u32 BE))`` read
big-endian, shifted right by 11 bits, over 2⁵³: a float64 in [0, 1). Everything in it is fixed before the
miner generates (the manifest hash exists only once the trainer publishes the version), so the batch a
miner announces is a function of the weights alone.

The token is the inverse CDF of ``u`` over the processed distribution: float64 softmax of the logits
over the temperature, top-p applied (the smallest set of likeliest tokens whose mass reaches ``top_p``,
ties broken by lower id, renormalised), tokens in id order: the smallest id whose cumulative mass
exceeds ``u`` times the total. Temperature 0 is greedy (the lowest id of the largest logit).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

SAMPLE_DOMAIN = b"p2prl/sample/v1"


def sample_key(manifest_hash: str, miner_key: bytes, prompt_index: int, sample_index: int) -> bytes:
    """The 32-byte key of one sample's uniforms (see the module docstring)."""
    if not 0 <= prompt_index < 2**64 or not 0 <= sample_index < 2**32:
        raise ValueError("prompt index must fit in u64 and sample index in u32")
    h = hashlib.sha256(SAMPLE_DOMAIN)
    h.update(bytes.fromhex(manifest_hash))
    h.update(bytes(miner_key))
    h.update(prompt_index.to_bytes(8, "big") + sample_index.to_bytes(4, "big"))
    return h.digest()


def uniforms(key: bytes, n: int) -> np.ndarray:
    """``u_t`` for positions ``t = 0 .. n-1`` of the sample keyed ``key``: float64 in [0, 1)."""
    out = np.empty(n, dtype=np.float64)
    for t in range(n):
        word = int.from_bytes(hashlib.sha256(key + t.to_bytes(4, "big")).digest()[:8], "big")
        out[t] = (word >> 11) * 2.0**-53
    return out


def processed_probs(
    logits: Any, temperature: float, top_p: float, through: Any = None, slack: float = 0.0
) -> Any:
    """float64 probabilities ``[B, V]`` of the distribution sampled from: softmax(logits / T), top-p
    kept set (likeliest first, ties by lower id) renormalised. ``temperature`` must be > 0.
    ``through``/``slack``: the validator's allowance at the cut (``top_p_drop``)."""
    import torch

    z = logits.double() / temperature
    return apply_top_p(torch.softmax(z, dim=-1), top_p, through, slack)


def apply_top_p(p: Any, top_p: float, through: Any = None, slack: float = 0.0) -> Any:
    """``processed_probs`` from the temperature-scaled float64 probabilities ``p``: the top-p kept set
    renormalised (``p`` itself at ``top_p`` 1), for a caller that needs both."""
    if top_p < 1.0:
        p = p.masked_fill(_top_p_drop(p, top_p, through, slack), 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def top_p_drop(logits: Any, temperature: float, top_p: float, through: Any = None, slack: float = 0.0) -> Any:
    """Bool ``[B, V]``: the tokens top-p leaves out, cut in float64 exactly as the pick cuts them
    (``processed_probs``), so a miner's logprobs are finite for every token it picked.

    ``through`` (token ids ``[B]``) with ``slack``: also keep each row's token, and every likelier one,
    when the mass before it is under ``top_p + slack``: the validator's allowance at the cut, the
    sampling check's margin, for logits a rounding step off the miner's (docs/PROTOCOL.md §10)."""
    import torch

    t = temperature if temperature > 0 else 1.0
    p = torch.softmax(logits.double() / t, dim=-1)
    return _top_p_drop(p, top_p, through, slack)


_FIRST_K = 256  # the likeliest tokens the cut looks among first: an LM's top-p set is usually smaller


def _top_p_drop(p: Any, top_p: float, through: Any = None, slack: float = 0.0) -> Any:
    """The cut of ``top_p_drop`` on probabilities ``p``: the likeliest tokens first (ties by lower id),
    each dropped once the mass before it reaches ``top_p``.

    Exactly the full sort's cut, without sorting the vocabulary: among the ``k`` likeliest tokens of a
    row, those strictly likelier than the ``k``-th are the first places of the full stable order, and
    a cumsum's first places depend on those places alone; once their mass reaches the cut, every later
    token is dropped, since adding non-negative numbers never decreases a sum (with ``through``: once
    the token is among them too, or their mass reaches the cut plus the slack). A row whose ``k``
    likeliest fall short is looked at again with four times as many, and past a
    quarter of the vocabulary sorted whole. On the CPU only, whose cumsum adds in order (a GPU's
    parallel scan may round a prefix otherwise); there the sort is cheap anyway."""
    import torch

    if p.dim() != 2 or p.shape[-1] <= 4 * _FIRST_K or p.device.type != "cpu":  # CPU: a sequential cumsum
        return _top_p_drop_sorted(p, top_p, through, slack)
    tgt = None
    if through is not None and slack > 0:
        tgt = torch.as_tensor(through, dtype=torch.long, device=p.device).reshape(-1, 1)
    drop = torch.ones_like(p, dtype=torch.bool)
    todo = torch.arange(p.shape[0], device=p.device)
    k = _FIRST_K
    while len(todo) and 4 * k <= p.shape[-1]:
        vals, idx = torch.topk(p[todo], k, dim=-1, sorted=False)
        kth = vals.amin(-1, keepdim=True)
        ids, by_id = idx.sort(-1)  # ids ascending, then a stable sort by probability: ties by lower id
        vals = vals.gather(-1, by_id)
        lead = vals > kth  # strictly likelier than the k-th: a prefix of the full order
        order = torch.where(lead, -vals, torch.inf).sort(dim=-1, stable=True).indices
        ids, sp, lead = ids.gather(-1, order), vals.gather(-1, order), lead.gather(-1, order)
        sp = sp.masked_fill(~lead, 0.0)
        cum = sp.cumsum(-1)
        before = cum - sp
        mass = cum[:, -1:]  # the leading tokens' mass: the zeros after them add nothing
        done = (mass >= top_p).squeeze(1)
        drop_sorted = (before >= top_p) | ~lead
        if tgt is not None:  # the token kept with every likelier one: settled once it is among the first
            hit = (ids == tgt[todo]) & lead
            found = hit.any(-1, keepdim=True)
            rank = hit.int().argmax(-1, keepdim=True)
            near = (before.gather(-1, rank) < top_p + slack) & found
            upto = torch.arange(k, device=p.device)[None, :] <= rank
            drop_sorted &= ~(upto & near)
            done &= (found | (mass >= top_p + slack)).squeeze(1)
        rows = todo[done]
        drop[rows] = drop[rows].scatter(-1, ids[done], drop_sorted[done])
        todo, k = todo[~done], 4 * k
    if len(todo):
        drop[todo] = _top_p_drop_sorted(p[todo], top_p, tgt[todo] if tgt is not None else None, slack)
    return drop


def _top_p_drop_sorted(p: Any, top_p: float, through: Any = None, slack: float = 0.0) -> Any:
    """``_top_p_drop`` by a stable sort of the whole row: the definition."""
    import torch

    # stable sort of -p keeps lower ids first among equal probabilities
    order = torch.sort(-p, dim=-1, stable=True).indices
    sp = p.gather(-1, order)
    before = sp.cumsum(-1) - sp
    drop_sorted = before >= top_p
    if through is not None and slack > 0:
        tgt = torch.as_tensor(through, dtype=torch.long, device=p.device).reshape(-1, 1)
        rank = (order == tgt).int().argmax(-1, keepdim=True)
        near = before.gather(-1, rank) < top_p + slack
        upto = torch.arange(p.shape[-1], device=p.device)[None, :] <= rank
        drop_sorted &= ~(upto & near)
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def pick_tokens(logits: Any, u: Any, temperature: float, top_p: float) -> Any:
    """Token ids ``[B]`` (long): the inverse CDF of ``u`` ``[B]`` over each row's processed distribution
    (temperature 0: greedy). Runs on the logits' device; ``u`` may be a numpy array or tensor."""
    import torch

    if temperature == 0:
        return logits.float().argmax(dim=-1)
    p = processed_probs(logits, temperature, top_p)
    cdf = p.cumsum(-1)
    uu = torch.as_tensor(u, dtype=torch.float64, device=cdf.device).reshape(-1, 1)
    x = uu * cdf[:, -1:]
    tok = torch.searchsorted(cdf, x, right=True).squeeze(1)
    # u * total rounds up to the total at worst: the last token with mass then
    last = (p > 0).cumsum(-1).argmax(-1)
    return torch.minimum(tok, last)


def token_intervals(
    logits: Any, tokens: Any, temperature: float, top_p: float, slack: float = 0.0
) -> tuple[Any, Any]:
    """Per row, the interval ``[lo, hi)`` of ``u`` that makes the inverse CDF pick ``tokens[row]``
    (float64 numpy arrays, in [0, 1]); greedy: [0, 1) for the argmax, empty otherwise. ``slack``:
    a token within it of the top-p cut counts as kept (the validator's allowance, ``top_p_drop``)."""
    import torch

    tgt = torch.as_tensor(tokens, dtype=torch.long, device=logits.device).reshape(-1, 1)
    if temperature == 0:
        lo, hi = greedy_intervals(logits, tgt)
    else:
        p = processed_probs(logits, temperature, top_p, tgt.squeeze(1) if slack > 0 else None, slack)
        lo, hi = intervals_of(p, tgt)
    return lo.cpu().numpy(), hi.cpu().numpy()


def greedy_intervals(logits: Any, tokens: Any) -> tuple[Any, Any]:
    """``intervals_of`` at temperature 0 (greedy): [0, 1) for the argmax, empty otherwise."""
    hit = (logits.float().argmax(-1, keepdim=True) == tokens).squeeze(1).double()
    return hit.new_zeros(hit.shape), hit


def intervals_of(p: Any, tokens: Any) -> tuple[Any, Any]:
    """Per row of processed probabilities ``p`` (``processed_probs``), the interval ``[lo, hi)`` of
    ``u`` whose inverse CDF picks ``tokens`` (``[B, 1]`` long): float64 tensors, the pick's own cumsum."""
    cdf = p.cumsum(-1)
    total = cdf[:, -1:]
    hi = cdf.gather(1, tokens) / total
    lo = hi - p.gather(1, tokens) / total
    return lo.squeeze(1).clamp(min=0.0), hi.squeeze(1)


def interval_distance(lo: np.ndarray, hi: np.ndarray, u: np.ndarray) -> np.ndarray:
    """How far each ``u`` lies outside its token's interval ``[lo, hi)``: 0 inside."""
    return np.maximum(0.0, np.maximum(lo - u, u - hi))
