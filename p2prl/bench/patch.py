"""The patch benchmark (``p2prl bench patch``): Qwen2.5-0.5B-shaped bf16 weights updated by a
real AdamW step from fp32 masters, encoded by this codec and by the PULSE reference codec."""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard

from p2prl.bench.pulse_ref import pulse_apply, pulse_encode
from p2prl.patch import intcode
from p2prl.patch.apply import apply_patch
from p2prl.patch.dtypes import uint_view
from p2prl.patch.encode import PatchEncoder
from p2prl.patch.hashing import weights_hash

# Qwen2.5-0.5B: hidden 896, intermediate 4864, 24 layers, 14 query / 2 key-value heads of 64, vocab 151936
QWEN05 = {"hidden": 896, "intermediate": 4864, "layers": 24, "kv": 128, "vocab": 151936}


def qwen_shapes(scale: float = 1.0) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of a Qwen2.5-0.5B-shaped model; ``scale`` shrinks the layer count and vocab."""
    h, i, kv = QWEN05["hidden"], QWEN05["intermediate"], QWEN05["kv"]
    layers = max(1, round(QWEN05["layers"] * scale))
    vocab = max(256, round(QWEN05["vocab"] * scale))
    yield "model.embed_tokens.weight", (vocab, h), "matrix"  # tied with lm_head
    for n in range(layers):
        p = f"model.layers.{n}."
        yield p + "input_layernorm.weight", (h,), "norm"
        yield p + "self_attn.q_proj.weight", (h, h), "matrix"
        yield p + "self_attn.q_proj.bias", (h,), "bias"
        yield p + "self_attn.k_proj.weight", (kv, h), "matrix"
        yield p + "self_attn.k_proj.bias", (kv,), "bias"
        yield p + "self_attn.v_proj.weight", (kv, h), "matrix"
        yield p + "self_attn.v_proj.bias", (kv,), "bias"
        yield p + "self_attn.o_proj.weight", (h, h), "matrix"
        yield p + "post_attention_layernorm.weight", (h,), "norm"
        yield p + "mlp.gate_proj.weight", (i, h), "matrix"
        yield p + "mlp.up_proj.weight", (i, h), "matrix"
        yield p + "mlp.down_proj.weight", (h, i), "matrix"
    yield "model.norm.weight", (h,), "norm"


def _init(shape: tuple[int, ...], kind: str, g: torch.Generator) -> torch.Tensor:
    if kind == "norm":
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if kind == "bias":
        return 0.3 * torch.randn(shape, generator=g)
    return 0.02 * torch.randn(shape, generator=g)


def make_weights(
    scale: float = 1.0, lr: float = 1e-6, warmup: int = 10, seed: int = 0
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(published bf16, next bf16): fp32 masters, ``warmup`` AdamW steps, publish, one more step.

    Each tensor gets its own AdamW instance (the update is elementwise, so this equals one
    optimizer over the model) and is freed before the next, so memory stays near the two bf16 sets.
    """
    g = torch.Generator().manual_seed(seed)
    base: dict[str, torch.Tensor] = {}
    new: dict[str, torch.Tensor] = {}
    for name, shape, kind in qwen_shapes(scale):
        p = torch.nn.Parameter(_init(shape, kind, g))
        opt = torch.optim.AdamW([p], lr=lr, weight_decay=0.01)
        for step in range(warmup + 1):
            if step == warmup:
                base[name] = p.detach().to(torch.bfloat16)
            p.grad = torch.randn(shape, generator=g)
            opt.step()
        new[name] = p.detach().to(torch.bfloat16)
        del p, opt
    gc.collect()
    return base, new


def _time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        out = None
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _read_time(state: dict[str, torch.Tensor], repeat: int) -> tuple[float, float, int]:
    """Seconds to read the weights once: the safetensors file from the page cache into memory,
    into a freshly allocated buffer and into a reused one."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="p2prl-bench-") as d:
        path = Path(d) / "w.safetensors"
        save_file(state, str(path))
        size = path.stat().st_size
        buf = bytearray(size)

        def read() -> None:
            with open(path, "rb", buffering=0) as f:
                f.readinto(buf)

        def read_fresh() -> None:
            fresh = bytearray(size)
            with open(path, "rb", buffering=0) as f:
                f.readinto(fresh)

        read()  # warm the page cache
        t_reused, _ = _time(read, repeat)
        t_fresh, _ = _time(read_fresh, repeat)
    return t_fresh, t_reused, size


def _index_study(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], level: int) -> dict[str, Any]:
    """LEB128 vs uint16-with-escape on this data: compressed size and encode/decode rate."""
    cctx = zstandard.ZstdCompressor(level=level)
    gaps_all = []
    for name in base:
        a, b = uint_view(base[name]), uint_view(new[name])
        for s in range(0, a.size, 1 << 22):
            pos = np.flatnonzero(a[s : s + (1 << 22)] != b[s : s + (1 << 22)])
            if pos.size:
                gaps_all.append(intcode.positions_to_gaps(pos))
    n = sum(g.size for g in gaps_all)
    out: dict[str, Any] = {"values": n}
    for label, enc, dec in (
        ("leb128", intcode.leb128_encode, intcode.leb128_decode),
        ("u16esc", intcode.u16esc_encode, intcode.u16esc_decode),
    ):
        t0 = time.perf_counter()
        raws = [enc(g) for g in gaps_all]
        t_enc = time.perf_counter() - t0
        comp = sum(len(cctx.compress(r)) for r in raws)
        t0 = time.perf_counter()
        for r, g in zip(raws, gaps_all, strict=True):
            dec(r, g.size)
        t_dec = time.perf_counter() - t0
        out[label] = {
            "raw_bytes": sum(len(r) for r in raws),
            "zstd_bytes": comp,
            "bits_per_index": 8 * comp / n if n else 0.0,
            "encode_mvals_s": n / t_enc / 1e6 if t_enc else 0.0,
            "decode_mvals_s": n / t_dec / 1e6 if t_dec else 0.0,
        }
    return out


def cached_weights(
    cache: Path | None, scale: float, lr: float, warmup: int, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """make_weights, kept as two safetensors files under ``cache`` so reruns skip the AdamW steps."""
    if cache is None:
        return make_weights(scale, lr, warmup, seed)
    from safetensors.torch import load_file, save_file

    tag = f"qwen-s{scale:g}-lr{lr:g}-w{warmup}-seed{seed}"
    paths = cache / f"{tag}-base.safetensors", cache / f"{tag}-new.safetensors"
    if all(p.exists() for p in paths):
        return load_file(str(paths[0])), load_file(str(paths[1]))
    base, new = make_weights(scale, lr, warmup, seed)
    cache.mkdir(parents=True, exist_ok=True)
    save_file(base, str(paths[0]))
    save_file(new, str(paths[1]))
    return base, new


def run(
    scale: float = 1.0,
    lr: float = 1e-6,
    zstd_level: int = 1,
    repeat: int = 3,
    seed: int = 0,
    warmup: int = 10,
    cache: Path | None = None,
) -> dict[str, Any]:
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    base, new = cached_weights(cache, scale, lr, warmup, seed)
    t_make = time.perf_counter() - t0
    numel = sum(t.numel() for t in base.values())
    nbytes = sum(t.numel() * t.element_size() for t in base.values())

    t_hash, base_hash = _time(lambda: weights_hash(base), repeat)
    new_hash = weights_hash(new)

    def ours(threads: int, with_hash: bool) -> tuple[bytes, Any]:
        enc = PatchEncoder(
            base,
            new,
            zstd_level=zstd_level,
            base_hash=base_hash,
            result_hash=None if with_hash else new_hash,
            threads=threads,
        )
        return b"".join(enc.segments()), enc.stats

    t_enc_hash, (patch, stats) = _time(lambda: ours(2, True), repeat)
    t_enc, _ = _time(lambda: ours(2, False), repeat)
    t_enc_1t, _ = _time(lambda: ours(1, False), repeat)
    t_apply, out = _time(lambda: apply_patch(base, patch, base_hash=base_hash), repeat)
    assert weights_hash(out) == new_hash
    del out
    t_apply_full, out = _time(lambda: apply_patch(base, patch), repeat)
    del out
    spare = {k: torch.empty_like(v) for k, v in base.items()}
    t_apply_staged, out = _time(lambda: apply_patch(base, patch, base_hash=base_hash, staging=spare), repeat)
    assert weights_hash(out) == new_hash
    out = spare = None

    t_ref_enc, ref = _time(lambda: pulse_encode(base, new, zstd_level), repeat)
    t_ref_apply, out = _time(lambda: pulse_apply(base, ref), repeat)
    assert weights_hash(out) == new_hash
    del out
    gc.collect()
    t_read, t_read_reused, file_bytes = _read_time(base, repeat)
    index = _index_study(base, new, zstd_level)

    changed = stats.changed
    return {
        "model": {
            "scale": scale,
            "params": numel,
            "bytes": nbytes,
            "lr": lr,
            "warmup_steps": warmup,
            "seed": seed,
        },
        "changed": changed,
        "changed_fraction": changed / numel,
        "make_weights_s": t_make,
        "read_weights_s": t_read,
        "read_weights_reused_buffer_s": t_read_reused,
        "read_file_bytes": file_bytes,
        "weights_hash_s": t_hash,
        "p2prl": {
            "bytes": len(patch),
            "bits_per_changed": 8 * len(patch) / changed,
            "index_bytes": stats.index_bytes,
            "value_bytes": stats.value_bytes,
            "value_codings": stats.value_codings,
            "segments": stats.segments,
            "dense_segments": stats.dense_segments,
            "encode_s": t_enc,
            "encode_with_result_hash_s": t_enc_hash,
            "encode_1thread_s": t_enc_1t,
            "decode_apply_verify_s": t_apply,
            "decode_apply_verify_both_hashes_s": t_apply_full,
            "decode_apply_verify_staged_s": t_apply_staged,
        },
        "pulse_ref": {
            "bytes": len(ref),
            "bits_per_changed": 8 * len(ref) / changed,
            "encode_s": t_ref_enc,
            "decode_apply_s": t_ref_apply,
        },
        "ratios": {
            "size_vs_pulse": len(patch) / len(ref),
            "encode_vs_pulse": t_enc / t_ref_enc,
            "encode_with_result_hash_vs_pulse": t_enc_hash / t_ref_enc,
            "apply_verify_vs_read": t_apply / t_read,
            "apply_verify_both_hashes_vs_read": t_apply_full / t_read,
            "apply_verify_staged_vs_read_reused": t_apply_staged / t_read_reused,
        },
        "index_coding": index,
        "zstd_level": zstd_level,
        "threads": os.cpu_count(),
    }


def cli_race(
    scale: float = 0.24,
    lr: float = 1e-6,
    warmup: int = 10,
    seed: int = 0,
    repeat: int = 3,
    cache: Path | None = None,
) -> dict[str, Any]:
    """``p2prl patch diff`` against PULSE's codec (numpy, no torch) as whole processes on the same
    two safetensors files: what a user waits for, imports and file reading included."""
    import subprocess
    import sys

    base, new = cached_weights(cache, scale, lr, warmup, seed)
    numel = sum(t.numel() for t in base.values())
    with tempfile.TemporaryDirectory(prefix="p2prl-patch-cli-") as tmp:
        d = Path(tmp)
        from safetensors.torch import save_file

        save_file(base, str(d / "base.safetensors"))
        save_file(new, str(d / "new.safetensors"))
        del base, new
        gc.collect()
        cmds = {
            "p2prl_patch_diff": [
                sys.executable,
                "-m",
                "p2prl",
                "patch",
                "diff",
                "base.safetensors",
                "new.safetensors",
                "-o",
                "p2prl.patch",
            ],
            "pulse_ref": [
                sys.executable,
                "-m",
                "p2prl.bench.pulse_ref",
                "base.safetensors",
                "new.safetensors",
                "pulse.patch",
            ],
        }
        times: dict[str, float] = {}
        for name, cmd in cmds.items():
            runs = []
            for _ in range(repeat + 1):  # the first run warms the page cache and is not counted
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=d, check=True, capture_output=True)
                runs.append(time.perf_counter() - t0)
            times[name] = statistics.median(runs[1:])
        sizes = {
            "p2prl_bytes": (d / "p2prl.patch").stat().st_size,
            "pulse_bytes": (d / "pulse.patch").stat().st_size,
        }
    return {
        "params": numel,
        "scale": scale,
        "repeat": repeat,
        "p2prl_patch_diff_s": times["p2prl_patch_diff"],
        "pulse_ref_s": times["pulse_ref"],
        "ratio": times["p2prl_patch_diff"] / times["pulse_ref"],
        **sizes,
    }
