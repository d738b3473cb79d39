"""vLLM V1 logits processor: each token is the network's public pick, not vLLM's own draw.

A request's ``SamplingParams.extra_args[EXTRA_KEY]`` carries its sample key (hex), temperature and
top-p. At output position ``t`` (the number of tokens it has generated) the processor takes the raw
logits row, picks ``rl.sampling.pick_tokens(row, uniforms(key)[t], T, top_p)`` and sets every other
logit to -inf, so whatever vLLM's sampler does next it emits that token. The one finite logit is the
token's processed logprob (``rl.engine.processed_logprobs``, as ``HFEngine`` reports it): the engine
runs with ``logprobs_mode="processed_logits"`` and temperature 1, so the logprob comes back as the
sampled token's logit. Requests without the entry pass through untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from p2prl.rl.engine import processed_logprobs
from p2prl.rl.sampling import pick_tokens, uniforms

EXTRA_KEY = "p2prl_pick"


class _Req:
    __slots__ = ("out", "temperature", "top_p", "u")

    def __init__(self, spec: dict[str, Any], max_tokens: int, out: list[int]) -> None:
        self.u = uniforms(bytes.fromhex(str(spec["key"])), max(1, max_tokens))
        self.temperature = float(spec["temperature"])
        self.top_p = float(spec["top_p"])
        self.out = out  # vLLM's running list of this request's output tokens


class KeyedPick(LogitsProcessor):
    """Batch-level processor: state per persistent-batch row, updated from vLLM's BatchUpdate."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Req] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for i, params, _prompt, out in batch_update.added:
            spec = (params.extra_args or {}).get(EXTRA_KEY) if params is not None else None
            if spec is None:
                self.rows.pop(i, None)
            else:
                self.rows[i] = _Req(spec, int(params.max_tokens or 1), out)
        for a, b, how in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if how == MoveDirectionality.SWAP and rb is not None:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        groups: dict[tuple[float, float], list[int]] = {}
        for i, r in self.rows.items():
            if i < logits.shape[0]:
                groups.setdefault((r.temperature, r.top_p), []).append(i)
        for (temp, top_p), idx in groups.items():
            rows = torch.tensor(idx, dtype=torch.long, device=logits.device)
            raw = logits.index_select(0, rows)
            u = np.array([self.rows[i].u[min(len(self.rows[i].out), len(self.rows[i].u) - 1)] for i in idx])
            tok = pick_tokens(raw, torch.from_numpy(u), temp, top_p).to(logits.device)
            if temp > 0:
                lp = processed_logprobs(raw, temp, top_p).gather(1, tok[:, None]).squeeze(1)
            else:
                lp = torch.log_softmax(raw.float(), dim=-1).gather(1, tok[:, None]).squeeze(1)
            lp = lp.clamp(min=-1e4)  # a float32 underflow must not leave the row without a finite logit
            forced = torch.full_like(raw, float("-inf"))
            forced.scatter_(1, tok[:, None], lp.to(forced.dtype)[:, None])
            logits.index_copy_(0, rows, forced)
        return logits
