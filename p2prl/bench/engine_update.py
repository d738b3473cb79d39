"""``p2prl bench engine-update``: what a version switch costs a rollout engine, in place against a reload.

A real trainer (the GRPO learner on synthetic rollout groups, ``bench.trainer``) takes a step per
version; the chain publisher signs each as a sparse patch; the node's own ``LiveWeights`` verifies
and applies it in place. Then, per engine:

- ``hf``: the live tensors are the model's own: nothing more to write; with ``separate`` (and always
  on CUDA) the engine holds its own copy and each switch is written into it as the changed elements
  (``HFEngine.write_changes``: positions and values only, on the engine's device).
- ``vllm``: the tensors the patch changed are written into the running engine (``VLLMEngine.update``:
  vLLM's patch loader, or its layerwise reload for a layer its CPU build packed).

Per version: ``publish_s``, the trainer's publish (snapshot, diff, encode, hash, sign, store);
``check_s``, the patch decoded and the result hash checked against the live weights on a second
thread while the engine goes on generating (``LiveWeights.prepare``, as the sync thread does);
``pause_s``, the swap: the changed elements written (``advance``) and, for an engine with its own
copy, written into it; ``switch_s`` = check + swap; ``in_place_s`` = switch + one token under the
new version. ``reload_s``: the alternative, a fresh engine on the new weights (written to a model
directory, the engine started, one token). Memory: the process's resident set before and after each
switch (``extra_bytes``), and the bytes written into the engine. Every version the engine's weights
hash (read back out of the engine) must equal the trainer's.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2prl.bench.trainer import synthetic_groups
from p2prl.crypto import Identity
from p2prl.node.weights.live import LiveWeights
from p2prl.node.weights.version import Weights
from p2prl.patch import ChainPublisher, ManifestStore, plan_sync, uint_view, weights_hash
from p2prl.rl import GenerationParams, HFEngine, load_tokenizer, load_weights_model, open_vllm, unique_state
from p2prl.rl.distributed import make_learner
from p2prl.rl.grpo import GRPOConfig
from p2prl.store import BlobStore

NET = "engine-update-bench"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _save_dir(src: Path, state: dict[str, torch.Tensor], out: Path) -> Path:
    """A model directory like ``src`` holding ``state`` (what a reload starts from)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # config, tokenizer, generation config: all but the weights
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), {"format": "pt"})
    return out


def _open(engine: str, model_dir: Path, tok: Any, device: str) -> tuple[Any, Any]:
    """(engine, its transformers model or None)."""
    if engine == "hf":
        model = load_weights_model(model_dir, torch.bfloat16).to(device)
        return HFEngine(model, tok, return_hidden=False), model
    return open_vllm(model_dir, tok, device, enforce_eager=not device.startswith("cuda")), None


class _Perturber:
    """A stand-in learner: each step moves ``density`` of the bf16 elements by 1–3 ulps."""

    def __init__(self, model_dir: Path, density: float) -> None:
        self.model = load_weights_model(model_dir, torch.bfloat16)
        self.state = {k: v.detach().clone() for k, v in unique_state(self.model).items()}
        self.density = density
        self._rng = np.random.default_rng(0)

    def step(self, _groups: Any) -> None:
        for t in self.state.values():
            v = uint_view(t)
            idx = np.flatnonzero(self._rng.random(v.size, dtype=np.float32) < self.density)
            v[idx] += self._rng.integers(1, 4, idx.size, dtype=v.dtype)

    def published_state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.state.items()}


def run(
    engine: str,
    model_dir: Path,
    versions: int = 10,
    device: str = "cpu",
    reloads: int = 2,
    lr: float = 1e-5,
    tokens: int = 16,
    separate: bool = False,
    density: float = 0.0,
    hash_first: bool = False,
) -> dict[str, Any]:
    """As a miner switches: the signed patch decoded beside generation, the swap, the result hashed
    beside generation after it (``confirm``; ``hash_first``: hashed before the swap, as a validator
    does). ``separate``: an HF engine that does not share the live tensors (as on CUDA) on any device.
    ``density`` > 0: no GRPO learner; each version moves that fraction of the bf16 elements by one
    to three ulps (seeded), as a trainer step at a small learning rate does (lr 1e-6 on a 0.5B
    shape changes 1.3%: docs/BENCHMARKS.md), for machines where the fp32 step itself is too slow."""
    if engine not in ("hf", "vllm"):
        raise ValueError("engine must be hf or vllm")
    model_dir = Path(model_dir)
    tok = load_tokenizer(model_dir)
    learner: Any = _Perturber(model_dir, density) if density > 0 else None
    if learner is None:
        master = load_weights_model(model_dir, torch.float32)
        learner = make_learner(master, GRPOConfig(lr=lr), tok.pad_id)
    vocab = int(learner.model.config.vocab_size)
    prompt = [tok.encode_prompt("1+2=")]
    first = GenerationParams(max_new_tokens=1)
    work = Path(tempfile.mkdtemp(prefix="p2prl-engine-update-"))
    try:
        pub = ChainPublisher(work / "trainer", Identity.generate(), NET, anchor_interval=10**6)
        store, index = BlobStore(work / "node"), ManifestStore(NET, pub.identity.public_key)

        def publish(state: dict[str, torch.Tensor]) -> Any:
            pv = pub.publish(state)
            for p in pv.items:
                index.add(p.envelope)
                store.put(p.blob, expected_id=p.manifest.blob.id)
            return pv

        v0 = learner.published_state()
        publish(v0)
        t0 = time.perf_counter()
        eng, hf = _open(engine, model_dir, tok, device)
        start_s = time.perf_counter() - t0
        shared = hf is not None and device == "cpu" and not separate
        # shared: the live tensors are the engine's own; else the node's CPU copy (on CUDA, or a vLLM
        # miner's HF copy), and each switch is written into the engine as the changed elements
        state = unique_state(hf) if shared else {k: v.clone() for k, v in v0.items()}
        live = LiveWeights(state, Weights(0, str(pub.result_hash), state))
        if hf is None:
            live.track_changes()
            live.take_changed()  # the engine was started on version 0's files
        gen = GenerationParams(max_new_tokens=tokens)
        eng.generate(prompt, 1, gen)  # warm
        rows: list[dict[str, Any]] = []
        for v in range(1, versions + 1):
            learner.step(synthetic_groups(8, 4, tokens, vocab, seed=v))
            new = learner.published_state()
            t0 = time.perf_counter()
            pv = publish(new)
            publish_s = time.perf_counter() - t0
            plan = plan_sync(v - 1, live.hash, index, v)
            gc.collect()
            rss0 = _rss()
            # the sync thread checks the patch against the live weights while the role generates
            box: dict[str, Any] = {}

            def check(plan: Any = plan, box: dict[str, Any] = box) -> None:
                t = time.perf_counter()
                box["prepared"] = live.prepare(plan, store.get, deferred=not hash_first)
                box["s"] = time.perf_counter() - t

            th = threading.Thread(target=check)
            t0 = time.perf_counter()
            th.start()
            generated = 0
            while th.is_alive():  # generation goes on beside the check
                eng.generate(prompt, 1, gen)
                generated += 1
            th.join()
            t1 = time.perf_counter()
            # the swap: only this pauses generation (an engine with its own copy takes the values; the
            # live copy is then written by confirm, as ModelHost does)
            w = live.advance(plan, store.get, box["prepared"], write_later=hf is not None and not shared)
            t2 = time.perf_counter()
            written = 0
            if hf is None:
                names = sorted(live.take_changed())
                written = sum(state[n].numel() * state[n].element_size() for n in names)
                eng.update(state, names)
            elif not shared:
                assert w.switch is not None
                written = eng.write_changes((x.name, x.start, x.positions, x.values) for x in w.switch.writes)
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # the pause ends when the device has the writes, not when queued
            t3 = time.perf_counter()
            eng.generate(prompt, 1, first)
            t4 = time.perf_counter()
            # the result hashed beside generation (nothing made with the version leaves before)
            confirm_s, confirmed = 0.0, True
            if live.unconfirmed is not None:
                done: dict[str, Any] = {}

                def confirm(done: dict[str, Any] = done, t3: float = t3) -> None:
                    done["ok"] = live.confirm()
                    done["s"] = time.perf_counter() - t3

                th = threading.Thread(target=confirm)
                th.start()
                while th.is_alive():
                    eng.generate(prompt, 1, gen)
                th.join()
                confirm_s, confirmed = done["s"], bool(done["ok"])
            rss1 = _rss()
            held = weights_hash(eng.read_state(state)) if engine == "vllm" else weights_hash(unique_state(hf))
            check_s = box["s"]
            rows.append(
                {
                    "version": v,
                    "publish_s": publish_s,
                    "check_s": check_s,
                    "generated_during_check": generated,
                    "swap_s": t2 - t1,
                    "engine_write_s": t3 - t2,
                    "pause_s": t3 - t1,
                    "switch_s": check_s + (t3 - t1),
                    "in_place_s": check_s + (t4 - t1),
                    "confirm_s": confirm_s,
                    "verified_s": check_s + (t3 - t1) + confirm_s,
                    "overlap_wall_s": t1 - t0,
                    "elements_written": w.switch.elements if w.switch else None,
                    "written_bytes": written,
                    "extra_bytes": rss1 - rss0,
                    "engine_hash_ok": confirmed and held == pv.result_hash == live.hash,
                }
            )
        reload_rows = []
        for i in range(min(reloads, versions)):
            if i:  # one more trainer version to reload onto
                learner.step(synthetic_groups(8, 4, tokens, vocab, seed=10**4 + i))
                publish(learner.published_state())
                live.advance(plan_sync(live.head, live.hash, index, live.head + 1), store.get)
            if engine == "vllm":
                eng.close()
                del eng  # one engine at a time: a second one would hold its own copy besides
                gc.collect()
            rss0 = _rss()
            t0 = time.perf_counter()
            d = _save_dir(model_dir, state, work / f"reload{i}")
            t1 = time.perf_counter()
            eng, _ = _open(engine, d, tok, device)
            eng.generate(prompt, 1, first)
            t2 = time.perf_counter()
            reload_rows.append({"write_s": t1 - t0, "reload_s": t2 - t0, "extra_bytes": _rss() - rss0})
        in_place = statistics.median(r["in_place_s"] for r in rows)
        med = {
            k: statistics.median(r[k] for r in rows)
            for k in ("switch_s", "pause_s", "publish_s", "check_s", "swap_s", "engine_write_s", "confirm_s", "verified_s")
        }
        reload_s = statistics.median(r["reload_s"] for r in reload_rows) if reload_rows else None
        params = sum(v.numel() for v in v0.values())
        return {
            "engine": engine,
            "device": device,
            "model_dir": str(model_dir),
            "parameters": params,
            "weights_bytes": sum(v.numel() * v.element_size() for v in v0.values()),
            "versions": versions,
            "engine_start_s": start_s,
            "in_place_s": in_place,
            "in_place_max_s": max(r["in_place_s"] for r in rows),
            "pause_s": med["pause_s"],
            "switch_s": med["switch_s"],
            "check_s": med["check_s"],
            "swap_s": med["swap_s"],
            "engine_write_s": med["engine_write_s"],
            "confirm_s": med["confirm_s"],
            "verified_s": med["verified_s"],
            "hash_first": hash_first,
            "publish_s": med["publish_s"],
            "separate_copy": not shared,
            "written_fraction": statistics.median(r["elements_written"] or 0 for r in rows) / params,
            "reload_s": reload_s,
            "in_place_vs_reload": in_place / reload_s if reload_s else None,
            "extra_bytes_in_place_max": max(r["extra_bytes"] for r in rows),
            "extra_bytes_reload": max(r["extra_bytes"] for r in reload_rows) if reload_rows else None,
            "engine_hash_ok_every_version": all(r["engine_hash_ok"] for r in rows),
            "peak_rss_bytes": _peak_rss(),
            "per_version": rows,
            "reloads": reload_rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
