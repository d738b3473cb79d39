"""The role's rollout engine: transformers (``hf``) or vLLM, as ``--engine`` settles it.

A vLLM miner keeps two views of one version: the live transformers state (node/weights/live.py: the tensors
the patch is verified against and applied to, in place) and vLLM's own copy, into which each switch
writes only the tensors the patch changed (``LiveWeights.take_changed``). vLLM returns no hidden
states, so after generating, one teacher-forced pass of the transformers copy over prompt and
completion (``proof.forward_flat``, the function the validator runs) gives the hidden states the
miner commits to, and the behaviour logprobs it reports: vLLM's own differ from the validator's
recomputation by the two engines' bf16 drift (up to ~0.15 per token, docs/PROOF.md), past the
mean-logprob floor on short completions; the pass's are the validator's numbers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from p2prl.node.runtime.role import NodeStartError, RoleEnv
from p2prl.node.setup.settings import RoleSettings
from p2prl.node.weights.disk import model_dir_for
from p2prl.node.weights.live import LiveWeights
from p2prl.patch import weights_hash
from p2prl.proof import forward_flat
from p2prl.rl import (
    EngineChoiceError,
    GenerationParams,
    HFEngine,
    RolloutEngine,
    Sample,
    Tokenizer,
    choose_engine,
    has_weights,
    open_vllm,
    pick_device,
    processed_logprobs,
)

log = logging.getLogger(__name__)

PROOF_ROWS = 64  # sequences per teacher-forced pass…
PROOF_LOGITS = 1 << 25  # …and at most this many logits (float32: 128 MiB)


class VLLMSampler(Protocol):
    """What the miner uses of ``p2prl.rl.vllm_engine.VLLMEngine`` (loaded by name: nothing imports it)."""

    tokenizer: Tokenizer

    def generate(
        self, prompts: list[list[int]], n_samples: int, params: GenerationParams, keys: list[list[bytes]] | None
    ) -> list[list[Sample]]: ...

    def update(self, state: Mapping[str, torch.Tensor], names: Iterable[str] | None = None) -> int: ...

    def read_state(self, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def close(self) -> None: ...


def _passes(flat: list[Sample], vocab: int) -> list[list[Sample]]:
    """The samples in runs of at most PROOF_ROWS sequences and PROOF_LOGITS logits each."""
    tokens = max(1, PROOF_LOGITS // max(1, vocab))
    runs: list[list[Sample]] = []
    run: list[Sample] = []
    n = 0
    for s in flat:
        if run and (len(run) == PROOF_ROWS or n + len(s.completion_ids) > tokens):
            runs.append(run)
            run, n = [], 0
        run.append(s)
        n += len(s.completion_ids)
    return [*runs, run] if run else runs


class VLLMMinerEngine:
    """vLLM samples; the transformers copy (``model``) supplies the committed hidden states."""

    name = "vllm"

    def __init__(
        self,
        inner: VLLMSampler,
        model: torch.nn.Module,
        live: LiveWeights | None = None,
        on_hash: Callable[[str], None] | None = None,
    ) -> None:
        self.inner = inner
        self.on_hash = on_hash  # given: the engine's weights are read back and hashed after each switch
        self.model = model
        self.tokenizer = inner.tokenizer
        self.live = live  # None: weights nobody patches (the proof benchmark's miner)
        if live is not None:
            live.track_changes()

    def generate(
        self,
        prompts: list[list[int]],
        n_samples: int,
        params: GenerationParams,
        keys: list[list[bytes]] | None = None,
    ) -> list[list[Sample]]:
        groups = self.inner.generate(prompts, n_samples, params, keys)
        flat = [s for g in groups for s in g if s.completion_ids]
        t = params.temperature if params.temperature > 0 else 1.0  # as the validator scores them
        for part in _passes(flat, int(self.model.config.vocab_size)):
            seqs = [(np.asarray(s.prompt_ids), np.asarray(s.completion_ids)) for s in part]
            hidden, logits = forward_flat(self.model, seqs)
            ids = torch.tensor([i for s in part for i in s.completion_ids])[:, None]
            lps = processed_logprobs(logits, t, params.top_p).gather(1, ids).squeeze(1)
            at = 0
            for s in part:
                n = len(s.completion_ids)
                s.hidden = hidden[at : at + n].clone()
                # the pass's logprobs, where finite (a token just outside its top-p set keeps vLLM's)
                s.logprobs = [a if math.isfinite(a) else b for a, b in zip(lps[at : at + n].tolist(), s.logprobs, strict=True)]
                at += n
        return groups

    def close(self) -> None:
        """End vLLM's engine thread (the engine goes with its last reference)."""
        self.inner.close()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Write what changed since the last call into vLLM (everything, for a state not the live one)
        and into the transformers copy where it does not share the state's tensors."""
        names = self.live.take_changed() if self.live is not None and state is self.live.state else set(state)
        own = self.model.state_dict()
        with torch.no_grad():
            for n in names:
                if n in own and own[n].data_ptr() != state[n].data_ptr():
                    own[n].copy_(state[n])
        self.inner.update(state, sorted(names))
        if self.on_hash is not None:
            self.on_hash(weights_hash(self.inner.read_state(state)))


def open_engine(
    env: RoleEnv[RoleSettings], role: str, model: torch.nn.Module, tok: Tokenizer, live: LiveWeights
) -> RolloutEngine:
    """The engine ``role`` generates with: vLLM only for a miner whose ``--engine`` settles on it."""
    cfg = env.settings.model
    if role != "miner" or cfg.engine == "hf":
        env.status.set(engine="hf")
        return HFEngine(model, tok)
    device = pick_device(cfg.device)
    path = model_dir_for(env.g.model, cfg.model, cfg.cache_dir)
    try:
        choice = choose_engine(cfg.engine, device, Path(path))
    except EngineChoiceError as e:
        raise NodeStartError(str(e)) from e
    if choice.notice:
        log.warning("%s", choice.notice)
        env.status.incr_label("warnings", "engine_fallback")
    env.status.set(engine=choice.name)
    if choice.name == "hf":
        return HFEngine(model, tok)
    kw: dict[str, bool | str] = {"enforce_eager": cfg.vllm_eager}
    if not has_weights(Path(path)):
        kw["load_format"] = "dummy"  # the first switch writes every tensor
    inner = open_vllm(Path(path), tok, device, **kw)
    log.info("engine vllm on %s (%s)", device, path)

    def on_hash(h: str) -> None:
        env.status.set(engine_weights_hash=h)
        env.status.incr("engine_weights_checked")
        if live.verified and h != live.hash:
            env.status.incr("engine_weights_mismatch")
            log.error("vLLM holds weights %.12s, the version is %.12s", h, live.hash)

    return VLLMMinerEngine(inner, model, live, on_hash if cfg.vllm_check_weights else None)


def open_reference_vllm(env: RoleEnv[RoleSettings], model: torch.nn.Module, tok: Tokenizer) -> VLLMMinerEngine:
    """A vLLM engine on ``model``'s weights, as the network's vLLM miners run it (this node's device,
    eager), with ``model`` supplying the proofs: what a validator mines calibration's reference
    batches with when its miners run vLLM. Raises NodeStartError where vLLM cannot run the model."""
    cfg = env.settings.model
    path = Path(model_dir_for(env.g.model, cfg.model, cfg.cache_dir))
    try:
        return reference_vllm(path, model, tok, pick_device(cfg.device))
    except EngineChoiceError as e:
        raise NodeStartError(str(e)) from e


def reference_vllm(path: Path, model: torch.nn.Module, tok: Tokenizer, device: str) -> VLLMMinerEngine:
    """A vLLM engine on the model directory ``path`` (eager off CUDA) running ``model``'s weights,
    which also supply the proofs. Raises EngineChoiceError where vLLM cannot run the model."""
    choose_engine("vllm", device, path)
    kw: dict[str, bool | str] = {"enforce_eager": not device.startswith("cuda")}
    if not has_weights(path):
        kw["load_format"] = "dummy"
    inner = open_vllm(path, tok, device, **kw)
    inner.update(model.state_dict())  # the version calibrated, whatever the directory holds
    return VLLMMinerEngine(inner, model)
