"""GRPO: group-normalized advantages, PPO-clipped importance ratios against behaviour logprobs.

The trainer owns an fp32 model (the master weights) and an AdamW optimizer. Miners sample from the
bf16 published copy, possibly a few versions old; the ratio ``π_θ / π_behaviour`` per token corrects
for both, and clipping bounds how far one stale or mismatched token can push. ``published_state``
is the bf16 cast the patch codec diffs against the previous publish.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from p2prl.rl.engine import copy_state_in_place
from p2prl.rl.model import unique_state
from p2prl.rl.types import RolloutGroup
from p2prl.rl.verify import RolloutCheck, group_uniforms, uniform_distances


class Row(NamedTuple):
    """One rollout as a step trains it: the group's ordinal in the step and the sample's in its group,
    its public uniforms (None: the group does not name them) and the margin its tokens are held to."""

    prompt: list[int]
    completion: list[int]
    behaviour: list[float]
    advantage: float
    group: int = -1
    sample: int = -1
    uniforms: np.ndarray | None = None
    margin: float = 0.0


# logits one micro-batch computes at once (256 MiB in fp32 per copy of them)
LOGIT_ELEMS = 1 << 26

@dataclass(frozen=True)
class Rejection:
    """A rollout the trainer did not train on: its tokens did not follow their public uniforms."""

    miner: str
    version: int
    index: int
    sample: int
    misses: int
    tokens: int


@dataclass
class GRPOConfig:
    """``temperature`` must match the miners' sampling temperature (ratios compare like with like)."""

    lr: float = 1e-4
    clip_eps: float = 0.2
    # dual clip: for a negative advantage the objective never falls below dual_clip·A, so a ratio
    # inflated by behaviour logprobs reported too low cannot multiply a rollout's gradient
    dual_clip: float = 3.0
    # tokens whose behaviour logprob is further than this (nats) from the trainer's own are left out
    # of the loss: too far off-policy to learn from, or a lie (an honest stale token is clipped there anyway)
    max_logprob_gap: float = 2.0
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    temperature: float = 1.0
    top_p: float = 1.0  # the network's, as temperature: the public uniforms pick from that distribution
    # every trained token of a group that names its uniforms (rl.verify) is checked against them under
    # the trainer's own distribution: beyond verify_margin (plus verify_margin_per_version for each
    # version the group is behind, ``extra["staleness"]``: the trainer's model has moved since) it is
    # not trained on, and a rollout with more such misses than verify_miss_rate explains at
    # verify_alpha is dropped with its group and reported (``rejected``). 0 turns the check off
    verify_margin: float = 0.1
    verify_margin_per_version: float = 0.05
    verify_miss_rate: float = 5e-3
    verify_alpha: float = 1e-6
    micro_batch: int = 512
    std_eps: float = 1e-6


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """``(r − mean) / (std + eps)`` within one group (population std); all-equal rewards give zeros."""
    r = rewards.float()
    if r.numel() < 2:
        return torch.zeros_like(r)
    std = r.std(unbiased=False)
    return (r - r.mean()) / (std + eps)


def policy_loss(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, cfg: GRPOConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token dual-clipped PPO loss ``−max(min(ρA, clip(ρ, 1±ε)A), c·A)`` (the outer max only for
    ``A < 0``), the ratio ``ρ``, and the mask of tokens within ``max_logprob_gap`` of the behaviour
    logprobs. Each token's gradient is then at most ``max(1+ε, c)·|A|·|∇ log π|``, whatever a miner
    reports as its behaviour logprobs: one forged rollout weighs no more than an honest one."""
    ratio = torch.exp((lp - old).clamp(-20, 20))
    surr = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
    surr = torch.where(adv < 0, torch.maximum(surr, cfg.dual_clip * adv), surr)
    trusted = mask & ((lp.detach() - old).abs() <= cfg.max_logprob_gap)
    return -surr, ratio, trusted


class PolicyLearner(Protocol):
    """What a trainer node uses of its learner: a :class:`GRPOTrainer` in one process, or rank 0's
    handle on one sharded over torchrun's ranks (``p2prl.rl.distributed.Leader``)."""

    checkpoint_name: str

    def step(self, groups: list[RolloutGroup]) -> dict[str, float]: ...

    def published_state(self) -> dict[str, Tensor]: ...

    def load_published(self, state: Mapping[str, Tensor]) -> None: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...

    def close(self) -> None: ...


class GRPOTrainer:
    """One optimizer step per ``step`` call over the given groups; ``version`` counts the steps."""

    checkpoint_name = "checkpoint.pt"

    def __init__(self, model: Any, config: GRPOConfig, pad_id: int = 0) -> None:
        self.model = model.float().train()
        self.config = config
        self.pad_id = pad_id
        self.version = 0
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            weight_decay=config.weight_decay,
        )
        self.rejected: list[Rejection] = []  # the last step's rollouts left out (rl.verify)
        # the last step's checked rollouts: (miner, prompt index, sample) -> (tokens trained on, tokens)
        self.trained_tokens: dict[tuple[str, int, int], tuple[int, int]] = {}
        self.ref = None
        if config.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)

    def _token_logprobs(
        self, model: Any, rows: list[tuple[list[int], list[int]]]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-token logprobs ``[B, T]`` of the completions (right-padded), their mask, and the
        logits ``[B, T, V]`` they came from (detached: what the token check reads)."""
        width = max(len(p) + len(c) for p, c in rows)
        tmax = max(len(c) for _, c in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        idx = torch.zeros((len(rows), tmax), dtype=torch.long)
        tgt = torch.zeros((len(rows), tmax), dtype=torch.long)
        mask = torch.zeros((len(rows), tmax), dtype=torch.bool)
        for i, (p, c) in enumerate(rows):
            n = len(p) + len(c)
            ids[i, :n] = torch.tensor(p + c)
            attn[i, :n] = 1
            idx[i, : len(c)] = torch.arange(len(p) - 1, n - 1)
            tgt[i, : len(c)] = torch.tensor(c)
            mask[i, : len(c)] = True
        dev = next(model.parameters()).device
        logits = model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits.float()
        logits = logits.gather(1, idx.to(dev)[:, :, None].expand(-1, -1, logits.shape[-1]))
        logp = torch.log_softmax(logits / self.config.temperature, dim=-1)
        return logp.gather(2, tgt.to(dev)[:, :, None]).squeeze(2), mask.to(dev), logits.detach()

    def step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """One GRPO update; groups whose rewards are all equal carry no signal and are skipped.

        Loss = token-mean over all completion tokens of ``policy_loss`` + ``kl_coef·KL`` (KL: the k3
        estimator against the initial policy), tokens beyond ``max_logprob_gap`` left out, and tokens
        that do not follow their public uniforms (``_verify``): a rollout with too many of them is
        left out with its group and listed in ``rejected``. Returns statistics; ``skipped`` = 1.0 when
        no group had signal (no optimizer step, version unchanged).
        """
        cfg = self.config
        rows: list[Row] = []
        rewards: list[float] = []
        self.rejected = []
        self.trained_tokens = {}
        for gi, g in enumerate(groups):
            rs = torch.tensor(g.rewards, dtype=torch.float32)
            rewards.extend(g.rewards)
            adv = group_advantages(rs, cfg.std_eps)
            if not bool(adv.abs().gt(0).any()):
                continue
            us = group_uniforms(g) if cfg.verify_margin > 0 else [None] * len(g.rollouts)
            stale = g.extra.get("staleness", 0)
            stale = max(0, stale) if isinstance(stale, int) else 0
            margin = cfg.verify_margin + cfg.verify_margin_per_version * stale
            for j, (r, a, u) in enumerate(zip(g.rollouts, adv.tolist(), us, strict=True)):
                if r.completion_ids:
                    rows.append(
                        Row(list(g.prompt_ids), list(r.completion_ids), list(r.logprobs), a, gi, j, u, margin)
                    )
        stats: dict[str, float] = {
            "groups": float(len(groups)),
            "reward_mean": float(sum(rewards) / len(rewards)) if rewards else 0.0,
            "rollouts_used": float(len(rows)),
        }
        if not rows:
            return {**stats, "skipped": 1.0, "loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "kl": 0.0}
        n_tok = sum(len(r.completion) for r in rows)
        rows = self.local_rows(rows)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "kl": 0.0, "untrusted": 0.0, "unverified": 0.0}
        per_mb = self._rows_per_micro_batch(rows)
        for s in range(0, len(rows), per_mb):
            mb = rows[s : s + per_mb]
            lp, mask, logits = self._token_logprobs(self.model, [(r.prompt, r.completion) for r in mb])
            old = torch.zeros_like(lp)
            adv = torch.zeros_like(lp)
            for i, r in enumerate(mb):
                old[i, : len(r.completion)] = torch.tensor(r.behaviour, dtype=torch.float32)
                adv[i, : len(r.completion)] = r.advantage
            per_tok, ratio, trusted = policy_loss(lp, old, adv, mask, cfg)
            verified = self._verify(mb, logits, mask, trusted, groups)
            tot["unverified"] += float((mask & ~verified).sum())
            trusted = trusted & verified
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _, _ = self._token_logprobs(self.ref, [(r.prompt, r.completion) for r in mb])
                d = ref_lp - lp
                kl = torch.exp(d) - d - 1
                per_tok = per_tok + cfg.kl_coef * kl
                tot["kl"] += float((kl.detach() * mask).sum())
            loss = (per_tok * trusted).sum() / n_tok
            loss.backward()
            tot["loss"] += float(loss.detach())
            tot["clipped"] += float((((ratio.detach() - 1).abs() > cfg.clip_eps) & mask).sum())
            tot["ratio"] += float((ratio.detach() * mask).sum())
            tot["untrusted"] += float((mask & ~trusted).sum())
        tot["rejected"] = float(len(self.rejected))
        self.reduce_totals(tot)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return {
            **stats,
            "skipped": 0.0,
            "loss": tot["loss"],
            "clip_frac": tot["clipped"] / n_tok,
            "ratio_mean": tot["ratio"] / n_tok,
            "kl": tot["kl"] / n_tok,
            "logprob_gap_frac": tot["untrusted"] / n_tok,
            "unverified_frac": tot["unverified"] / n_tok,
            "rejected_rollouts": tot["rejected"],
            "grad_norm": float(grad_norm),
            "tokens": float(n_tok),
        }

    def _rows_per_micro_batch(self, rows: list[Row]) -> int:
        """``micro_batch``, or fewer rows where their logits would pass ``LOGIT_ELEMS``: a micro-batch
        holds its ``[rows, width, vocab]`` logits several times over (a 49k vocabulary at 512 rows took
        more than 24 GiB). The loss is a sum over rows, so the split changes no gradient's meaning."""
        vocab = int(getattr(getattr(self.model, "config", None), "vocab_size", 0) or 0)
        width = max(len(r.prompt) + len(r.completion) for r in rows)
        if vocab <= 0:
            return self.config.micro_batch
        return max(1, min(self.config.micro_batch, LOGIT_ELEMS // (width * vocab)))

    def _verify(
        self, mb: list[Row], logits: Tensor, mask: Tensor, trusted: Tensor, groups: list[RolloutGroup]
    ) -> Tensor:
        """Which tokens of a micro-batch may be trained on: those whose uniform lies within the row's
        margin of its interval under the trainer's distribution (rows without uniforms: all). A row
        whose misses are more than honest drift explains fails: every row of its group in this micro-batch is left out, and it goes to ``rejected``."""
        cfg = self.config
        ok = torch.ones_like(mask)
        live = [i for i, r in enumerate(mb) if r.uniforms is not None and r.completion]
        if not live:
            return ok
        t = cfg.temperature if cfg.temperature > 0 else 1.0
        flat = torch.cat([logits[i, : len(mb[i].completion)] for i in live])
        toks = np.concatenate([mb[i].completion for i in live])
        u = np.concatenate([mb[i].uniforms for i in live])  # type: ignore[misc]
        dist = uniform_distances(flat, toks, u, t, cfg.top_p)
        check = RolloutCheck(cfg.verify_miss_rate, cfg.verify_alpha)
        failed: set[int] = set()
        at = 0
        for i in live:
            r = mb[i]
            n = len(r.completion)
            follows = torch.as_tensor(dist[at : at + n] <= r.margin, device=ok.device)
            at += n
            ok[i, :n] = follows
            misses = int((~follows).sum())  # a logprob gap grows with honest drift: masked, not proof
            if check.fails(misses, n):
                failed.add(r.group)
                g = groups[r.group]
                self.rejected.append(Rejection(g.miner, g.version, g.index, r.sample, misses, n))
        for i, r in enumerate(mb):
            if r.group in failed:
                ok[i] = False
            if r.uniforms is not None:
                g = groups[r.group]
                n = len(r.completion)
                self.trained_tokens[(g.miner, g.index, r.sample)] = (int((ok[i, :n] & trusted[i, :n]).sum()), n)
        return ok

    def local_rows(self, rows: list[Any]) -> list[Any]:
        """This process's share of the step's rollouts (all of them; sharded learners take a slice)."""
        return rows

    def reduce_totals(self, tot: dict[str, float]) -> None:
        """Sum the statistics over data-parallel ranks (nothing to do in one process)."""

    def published_state(self) -> dict[str, Tensor]:
        """A bf16 CPU copy of the weights (tied aliases once), for the patch codec and the engines."""
        return {k: v.detach().to("cpu", torch.bfloat16, copy=True) for k, v in unique_state(self.model).items()}

    def load_published(self, state: Mapping[str, Tensor]) -> None:
        """Set the fp32 master weights from a (bf16) published state, e.g. to resume from an anchor."""
        copy_state_in_place(self.model, state)

    def save(self, path: Path) -> None:
        """Master weights, optimizer state, version and config, for restarts (atomic replace)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "model": unique_state(self.model),
                "optimizer": self.opt.state_dict(),
                "version": self.version,
                "config": asdict(self.config),
            },
            tmp,
        )
        tmp.replace(path)

    def load(self, path: Path) -> None:
        """Restore what ``save`` wrote (the model architecture must match)."""
        ckpt = torch.load(Path(path), map_location="cpu", weights_only=True)
        copy_state_in_place(self.model, ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.version = int(ckpt["version"])

    def close(self) -> None:
        """Nothing to release in one process (a sharded learner releases its ranks)."""
