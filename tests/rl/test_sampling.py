"""Verifiable sampling: public uniforms and the inverse-CDF rule (p2prl/rl/sampling.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from p2prl.rl.sampling import (
    interval_distance,
    pick_tokens,
    processed_probs,
    sample_key,
    token_intervals,
    uniforms,
)


def test_sample_key_and_uniforms_follow_the_spec() -> None:
    mh, miner = "ab" * 32, bytes(range(32))
    key = sample_key(mh, miner, 5, 3)
    want = hashlib.sha256(
        b"p2prl/sample/v1" + bytes.fromhex(mh) + miner + (5).to_bytes(8, "big") + (3).to_bytes(4, "big")
    ).digest()
    assert key == want
    u = uniforms(key, 4)
    word = int.from_bytes(hashlib.sha256(key + (2).to_bytes(4, "big")).digest()[:8], "big")
    assert u[2] == (word >> 11) / 2**53
    assert np.all((u >= 0) & (u < 1)) and len(set(u.tolist())) == 4
    assert sample_key(mh, miner, 5, 4) != key and sample_key(mh, bytes(32), 5, 3) != key


def test_inverse_cdf_picks_the_token_whose_interval_holds_u() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]] * 5, dtype=torch.bfloat16)
    p = processed_probs(logits, 1.0, 1.0)[0].numpy()
    cdf = np.cumsum(p)
    u = np.array([0.0, cdf[0] - 1e-9, cdf[0] + 1e-9, cdf[2] - 1e-9, 1 - 1e-12])
    tok = pick_tokens(logits, u, 1.0, 1.0).tolist()
    assert tok == [0, 0, 1, 2, 3]
    lo, hi = token_intervals(logits, torch.tensor(tok), 1.0, 1.0)
    assert np.all(interval_distance(lo, hi, u) == 0)
    # any other token's interval misses u
    other = [(t + 1) % 4 for t in tok]
    lo2, hi2 = token_intervals(logits, torch.tensor(other), 1.0, 1.0)
    assert np.all(interval_distance(lo2, hi2, u) > 0)


def test_top_p_and_greedy() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, -5.0]])
    p = processed_probs(logits, 1.0, 0.9)[0]
    assert p[2] == 0 and p[3] == 0 and abs(float(p.sum()) - 1) < 1e-12
    assert pick_tokens(logits, np.array([0.99]), 1.0, 0.9).tolist() == [1]
    assert pick_tokens(logits, np.array([0.99]), 0.0, 1.0).tolist() == [0]


def test_sampled_tokens_follow_the_distribution() -> None:
    """Over many public uniforms, the inverse CDF reproduces the processed probabilities."""
    logits = torch.tensor([[0.5, 1.5, -0.5, 2.0]] * 20000)
    u = np.concatenate([uniforms(sample_key("00" * 32, bytes(32), i, 0), 1) for i in range(20000)])
    tok = pick_tokens(logits, u, 0.7, 1.0).numpy()
    freq = np.bincount(tok, minlength=4) / len(tok)
    p = processed_probs(logits[:1], 0.7, 1.0)[0].numpy()
    assert np.abs(freq - p).max() < 0.02  # 20,000 draws: 4.5 standard deviations at worst


def test_protocol_worked_example_matches_the_code() -> None:
    """docs/PROTOCOL.md §10's worked example is what the code computes."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    key = sample_key("ab" * 32, bytes(range(32)), 5, 3)
    assert key.hex() in doc
    u = uniforms(key, 4)
    for x in u:
        assert repr(float(x)) in doc
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]], dtype=torch.bfloat16)
    for x in processed_probs(logits, 1.0, 1.0)[0].tolist():
        assert repr(x) in doc
    assert pick_tokens(logits, u[:1], 1.0, 1.0).tolist() == [2]
    assert pick_tokens(logits, u[1:2], 1.0, 1.0).tolist() == [1]
    sharp = pick_tokens(logits, u[1:2], 0.5, 1.0)
    assert sharp.tolist() == [2]
    lo, hi = token_intervals(logits, sharp, 1.0, 1.0)
    d = interval_distance(lo, hi, u[1:2])
    assert f"{float(d[0]):.5f}" in doc and d[0] > 0.002


def test_the_pick_and_its_logprob_cut_top_p_alike() -> None:
    """bf16 logits tie often; a float32 cut of its own (unstable sort) kept one of two tied tokens at
    the top-p boundary where the pick's float64 cut kept the other, so a picked token's logprob was
    ``-inf`` and the honest batch failed ``batch_malformed`` (hard). One cut: every token the pick can
    take has a finite logprob, and none it cannot."""
    import torch

    from p2prl.rl import processed_logprobs
    from p2prl.rl.sampling import processed_probs

    z = (torch.randn(4096, 64, generator=torch.Generator().manual_seed(0)) * 2).bfloat16()
    for temperature, top_p in ((0.7, 0.9), (1.0, 0.95), (0.5, 0.5)):
        kept = processed_probs(z, temperature, top_p) > 0
        assert torch.equal(torch.isfinite(processed_logprobs(z, temperature, top_p)), kept)


def test_a_token_at_the_cut_is_kept_within_the_validators_slack() -> None:
    """A validator whose logits sit a rounding step off the miner's may see the cut fall just before a
    token the miner's cut kept: within ``slack`` of the cut it counts as kept (finite logprob, a
    non-empty interval); far past the cut it does not."""
    import torch

    from p2prl.rl import processed_logprobs
    from p2prl.rl.sampling import top_p_drop

    z = torch.tensor([[3.0, 2.0, 1.0, 0.5, -1.0]])
    p = torch.softmax(z.double(), -1)[0]
    before = float(p[:3].sum())  # mass before token 3, the fourth likeliest
    top_p = before - 1e-4  # the cut falls just before token 3
    tok = torch.tensor([3])
    assert bool(top_p_drop(z, 1.0, top_p)[0, 3])
    assert not bool(top_p_drop(z, 1.0, top_p, tok, slack=2e-3)[0, 3])
    assert torch.isfinite(processed_logprobs(z, 1.0, top_p, tok, 2e-3)[0, 3])
    assert bool(top_p_drop(z, 1.0, top_p, torch.tensor([4]), slack=2e-3)[0, 4])  # past the slack
    lo, hi = token_intervals(z, tok, 1.0, top_p, slack=2e-3)
    assert hi[0] > lo[0]


def test_the_cut_among_the_likeliest_is_the_full_sorts_cut_bit_for_bit() -> None:
    """Top-p looks among the row's likeliest tokens instead of sorting the vocabulary: the dropped set
    must be the full stable sort's exactly (ties by lower id included), with and without the
    validator's slack, for sharp rows, flat rows that need more candidates, and a row of ties alone."""
    from p2prl.rl.sampling import _top_p_drop, _top_p_drop_sorted

    gen = torch.Generator().manual_seed(0)
    vocab = 4096  # candidates 256, then 1024, then the whole sort
    rows = [torch.randn(48, vocab, generator=gen) * s for s in (8.0, 3.0, 1.0, 0.3)]  # sharp to flat
    coarse = (torch.randn(16, vocab, generator=gen) * 4).round()  # few distinct logits: ties at the cut
    logits = torch.cat([*rows, coarse, torch.zeros(2, vocab)]).bfloat16()
    targets = torch.randint(0, vocab, (logits.shape[0],), generator=gen)
    checked = 0
    for temperature in (0.7, 1.0):
        p = torch.softmax(logits.double() / temperature, dim=-1)
        targets[::3] = p[::3].argsort(-1, descending=True)[:, 40]  # likely tokens near a cut too
        for top_p in (0.5, 0.9, 0.95, 0.999):
            for through, slack in ((None, 0.0), (targets, 0.05), (targets, 0.3)):
                fast = _top_p_drop(p, top_p, through, slack)
                assert torch.equal(fast, _top_p_drop_sorted(p, top_p, through, slack)), (temperature, top_p, slack)
                checked += int((~fast).sum())
    assert checked > 100_000  # the kept sets were not trivially small
