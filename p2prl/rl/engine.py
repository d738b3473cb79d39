"""Rollout engines: sample completions with behaviour logprobs and the hidden states a proof needs.

``HFEngine`` runs any ``transformers`` causal LM on CPU (or GPU) with its own batched sampling loop
over a KV cache, so the logprobs it reports are exactly those of the distribution it sampled from
(after temperature and top-p) and each hidden state sits at the position that produced its token.
``teacher_forced`` recomputes both with one full forward pass, as a validator does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from p2prl.rl.sampling import pick_tokens, top_p_drop, uniforms
from p2prl.rl.tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings. ``temperature == 0`` is greedy (logprobs then reported at temperature 1)."""

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass
class Sample:
    """One completion: tokens (the stop token included when sampled), their behaviour logprobs, and the
    float32 last-layer hidden states ``[len(completion_ids), d]`` whose logits produced each token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    hidden: Tensor | None


class RolloutEngine(Protocol):
    """What a miner needs from an inference backend."""

    model: Any

    def generate(
        self,
        prompts: list[list[int]],
        n_samples: int,
        params: GenerationParams,
        keys: list[list[bytes]] | None = None,
    ) -> list[list[Sample]]:
        """``n_samples`` completions per prompt, in prompt order. With ``keys`` (``keys[i][j]``: the
        sample key of prompt ``i``'s sample ``j``, ``rl.sampling``) every token is the inverse CDF of
        its public uniform, so the result is a function of the weights alone."""
        ...

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Overwrite the weights in place (no reload); names as in the HF state dict."""
        ...


def processed_logprobs(
    logits: Tensor, temperature: float, top_p: float, through: Tensor | None = None, slack: float = 0.0
) -> Tensor:
    """Log-probabilities of the distribution actually sampled: logits / T in float32, renormalized over
    the tokens top-p keeps, with the pick's own float64 cut (``sampling.top_p_drop``; ``through`` and
    ``slack``: the validator's allowance at the cut). One cut for the pick and its logprob: a float32
    cut of its own dropped tokens the pick had just kept, and their logprob was ``-inf``."""
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else logits
    logp = torch.log_softmax(scaled, dim=-1)
    if top_p < 1.0:
        drop = top_p_drop(logits, temperature, top_p, through, slack)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


def copy_state_in_place(model: torch.nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy ``state`` into the model's tensors (dtype-converting); unknown or missing names raise.

    A name may be absent only when its tensor is tied to one that is present (e.g. ``lm_head.weight``).
    """
    own = model.state_dict()
    unknown = set(state) - set(own)
    if unknown:
        raise KeyError(f"unknown weights: {sorted(unknown)[:5]}")
    present_ptrs = {own[k].data_ptr() for k in state}
    missing = [k for k in own if k not in state and own[k].data_ptr() not in present_ptrs]
    if missing:
        raise KeyError(f"missing weights: {missing[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"shape mismatch for {k}: {tuple(v.shape)} vs {tuple(own[k].shape)}")
            if v.data_ptr() != own[k].data_ptr():  # a state made of the model's own tensors is loaded
                own[k].copy_(v)


# signed integer dtypes of each element width: a write copies bit patterns, never converts values
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def scatter_into(model: torch.nn.Module, writes: Iterable[tuple[str, int, Tensor | None, Tensor]]) -> int:
    """Write changed elements into the model's own tensors, on their device: each write is ``(name,
    start, positions or None, values)``, values at flat ``start + positions`` (None: a run from
    ``start``). Only the changed elements (and their positions) cross to the device; one code path for
    CPU and CUDA. Values of the tensor's dtype are copied as bit patterns. Returns the bytes written."""
    own = model.state_dict()
    written = 0
    with torch.no_grad():
        for name, start, pos, vals in writes:
            t = own[name]
            if not t.is_contiguous():
                raise ValueError(f"{name} is not contiguous: cannot write elements in place")
            flat = t.view(-1)
            if vals.dtype == t.dtype:
                bits = _BITS[t.element_size()]
                flat, vals = flat.view(bits), vals.view(bits)
            if pos is None:
                dst = flat[start : start + vals.numel()]
                if dst.data_ptr() != vals.data_ptr():  # the live tensors may be the engine's own
                    dst.copy_(vals, non_blocking=True)
            else:
                idx = pos.to(t.device, non_blocking=True)
                if start:
                    idx = idx + start
                # scatter_, not index_copy_/index_put_: on the CPU those run 50x slower under load
                flat.scatter_(0, idx, vals.to(t.device, flat.dtype, non_blocking=True))
            written += vals.numel() * vals.element_size()
    return written


def _lm_head(model: Any) -> torch.nn.Module:
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("model has no output embedding")
    return head


class HFEngine:
    """Batched sampling with a ``transformers`` causal LM: left padding, KV cache, seeded generator."""

    def __init__(
        self, model: Any, tokenizer: Tokenizer, return_hidden: bool = True, max_batch: int = 512
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.return_hidden = return_hidden
        self.max_batch = max_batch

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        copy_state_in_place(self.model, state)

    def write_changes(self, writes: Iterable[tuple[str, int, Tensor | None, Tensor]]) -> int:
        """Apply a version switch's writes to the model on its device (``scatter_into``): a switch
        costs the changed elements, not a copy of the model. Returns the bytes written."""
        return scatter_into(self.model, writes)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n_samples: int,
        params: GenerationParams,
        keys: list[list[bytes]] | None = None,
    ) -> list[list[Sample]]:
        if n_samples < 1:
            raise ValueError("n_samples must be >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if keys is not None and [len(k) for k in keys] != [n_samples] * len(prompts):
            raise ValueError("keys must give one sample key per prompt and sample")
        rows = [p for p in prompts for _ in range(n_samples)]
        row_keys = [k for ks in keys for k in ks] if keys is not None else None
        gen = torch.Generator(device="cpu").manual_seed(params.seed)
        flat: list[Sample] = []
        for start in range(0, len(rows), self.max_batch):
            part = slice(start, start + self.max_batch)
            us = None
            if row_keys is not None:
                us = torch.from_numpy(np.stack([uniforms(k, params.max_new_tokens) for k in row_keys[part]]))
            flat.extend(self._generate_batch(rows[part], params, gen, us))
        return [flat[i * n_samples : (i + 1) * n_samples] for i in range(len(prompts))]

    @torch.no_grad()
    def generate_rows(self, rows: list[list[int]], us: np.ndarray, params: GenerationParams) -> list[Sample]:
        """One completion per row drawn with the given uniforms (``us[k, t]`` for row ``k``'s token
        ``t``; ``params.max_new_tokens`` at most ``us.shape[1]``): a rollout continued from any of its
        positions with its own public uniforms (``proof.sides``)."""
        if len(rows) != len(us) or us.ndim != 2 or params.max_new_tokens > us.shape[1]:
            raise ValueError("one row of uniforms per row, at least max_new_tokens long")
        gen = torch.Generator(device="cpu").manual_seed(params.seed)
        out: list[Sample] = []
        for start in range(0, len(rows), self.max_batch):
            part = slice(start, start + self.max_batch)
            out.extend(self._generate_batch(rows[part], params, gen, torch.from_numpy(np.ascontiguousarray(us[part]))))
        return out

    def _generate_batch(
        self,
        rows: list[list[int]],
        params: GenerationParams,
        gen: torch.Generator,
        us: Tensor | None = None,
    ) -> list[Sample]:
        dev = self.device
        bsz, width = len(rows), max(len(r) for r in rows)
        pad = self.tokenizer.pad_id
        stops = torch.tensor(sorted(self.tokenizer.stop_ids), dtype=torch.long, device=dev)
        ids = torch.full((bsz, width), pad, dtype=torch.long)
        mask = torch.zeros((bsz, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        base, head = self.model.base_model, _lm_head(self.model)
        out = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache, h = out.past_key_values, out.last_hidden_state[:, -1]
        last_pos = pos[:, -1]
        tokens: list[Tensor] = []
        lps: list[Tensor] = []
        hiddens: list[Tensor] = []
        done = torch.zeros(bsz, dtype=torch.bool, device=dev)
        lengths = torch.full((bsz,), params.max_new_tokens, dtype=torch.long)
        for t in range(params.max_new_tokens):
            logits = head(h)
            if params.temperature == 0:
                logp = torch.log_softmax(logits.float(), dim=-1)
                tok = logp.argmax(dim=-1)
            else:
                logp = processed_logprobs(logits, params.temperature, params.top_p)
                if us is not None:
                    tok = pick_tokens(logits, us[:, t], params.temperature, params.top_p).to(dev)
                else:
                    tok = torch.multinomial(logp.exp().cpu(), 1, generator=gen).squeeze(1).to(dev)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            tokens.append(tok)
            lps.append(logp.gather(1, tok[:, None]).squeeze(1))
            if self.return_hidden:
                hiddens.append(h.float())
            newly = (~done) & torch.isin(tok, stops)
            lengths[newly.cpu()] = t + 1
            done |= newly
            if bool(done.all()) or t + 1 == params.max_new_tokens:
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            last_pos = last_pos + 1
            out = base(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=last_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, h = out.past_key_values, out.last_hidden_state[:, -1]
        tok_m = torch.stack(tokens, 1).cpu()
        lp_m = torch.stack(lps, 1).float().cpu()
        hid_m = torch.stack(hiddens, 1).cpu() if self.return_hidden else None
        samples = []
        for i, r in enumerate(rows):
            n = int(lengths[i])
            samples.append(
                Sample(
                    prompt_ids=list(r),
                    completion_ids=tok_m[i, :n].tolist(),
                    logprobs=lp_m[i, :n].tolist(),
                    hidden=hid_m[i, :n].clone() if hid_m is not None else None,
                )
            )
        return samples


@torch.no_grad()
def teacher_forced(
    model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0, top_p: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Logprobs ``[n]`` and float32 last hidden states ``[n, d]`` of a given completion, one full
    forward pass without cache: what a validator compares against a miner's report."""
    if not prompt_ids or not completion_ids:
        raise ValueError("prompt and completion must be non-empty")
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long, device=dev)
    h = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
    h = h[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(completion_ids)]
    logits = _lm_head(model)(h)
    logp = processed_logprobs(logits, temperature if temperature > 0 else 1.0, top_p)
    tgt = torch.tensor(completion_ids, dtype=torch.long, device=dev)
    return logp.gather(1, tgt[:, None]).squeeze(1).float().cpu(), h.float().cpu()
