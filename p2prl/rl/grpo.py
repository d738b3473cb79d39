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
from typing import Any, Protocol

import torch
from torch import Tensor

from p2prl.rl.engine import copy_state_in_place
from p2prl.rl.model import unique_state
from p2prl.rl.types import RolloutGroup


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
        self.ref = None
        if config.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)

    def _token_logprobs(self, model: Any, rows: list[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor]:
        """Per-token logprobs ``[B, T]`` of the completions (right-padded) and their mask."""
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
        return logp.gather(2, tgt.to(dev)[:, :, None]).squeeze(2), mask.to(dev)

    def step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """One GRPO update; groups whose rewards are all equal carry no signal and are skipped.

        Loss = token-mean over all completion tokens of ``policy_loss`` + ``kl_coef·KL`` (KL: the k3
        estimator against the initial policy), tokens beyond ``max_logprob_gap`` left out. Returns statistics; ``skipped`` = 1.0 when
        no group had signal (no optimizer step, version unchanged).
        """
        cfg = self.config
        rows: list[tuple[list[int], list[int], list[float], float]] = []
        rewards: list[float] = []
        for g in groups:
            rs = torch.tensor(g.rewards, dtype=torch.float32)
            rewards.extend(g.rewards)
            adv = group_advantages(rs, cfg.std_eps)
            if not bool(adv.abs().gt(0).any()):
                continue
            for r, a in zip(g.rollouts, adv.tolist(), strict=True):
                if r.completion_ids:
                    rows.append((list(g.prompt_ids), list(r.completion_ids), list(r.logprobs), a))
        stats: dict[str, float] = {
            "groups": float(len(groups)),
            "reward_mean": float(sum(rewards) / len(rewards)) if rewards else 0.0,
            "rollouts_used": float(len(rows)),
        }
        if not rows:
            return {**stats, "skipped": 1.0, "loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "kl": 0.0}
        n_tok = sum(len(c) for _, c, _, _ in rows)
        rows = self.local_rows(rows)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "kl": 0.0, "untrusted": 0.0}
        for s in range(0, len(rows), cfg.micro_batch):
            mb = rows[s : s + cfg.micro_batch]
            lp, mask = self._token_logprobs(self.model, [(p, c) for p, c, _, _ in mb])
            old = torch.zeros_like(lp)
            adv = torch.zeros_like(lp)
            for i, (_, c, b, a) in enumerate(mb):
                old[i, : len(c)] = torch.tensor(b, dtype=torch.float32)
                adv[i, : len(c)] = a
            per_tok, ratio, trusted = policy_loss(lp, old, adv, mask, cfg)
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = self._token_logprobs(self.ref, [(p, c) for p, c, _, _ in mb])
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
            "grad_norm": float(grad_norm),
            "tokens": float(n_tok),
        }

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
