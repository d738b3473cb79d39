"""The default model: a tiny Qwen2-style char-level LM the project builds itself, plus local loading.

No pretrained weights can be fetched, so ``build_default_model`` creates one from a fixed seed and
warm-starts it on the default task with a short supervised run (fixed data, fixed step count) until
it answers some problems but far from all — the regime where RL has something to learn. The result
is an ordinary HF model directory (config.json, model.safetensors in bf16, the char vocabulary as a
``tokenizers`` tokenizer.json) loaded like any other, plus ``p2prl_model.json`` recording its weights
hash and warm-start result.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from p2prl.patch import weights_hash as patch_hash
from p2prl.rl.cpu import torch_threads
from p2prl.rl.tasks import AdditionTask
from p2prl.rl.tokenizer import CharTokenizer, TextTokenizer, load_tokenizer

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "p2prl-tiny-addition-v3"  # bump whenever ARCH, WARM_START or the files change
META_FILE = "p2prl_model.json"
DIGITS = 2
# Small on purpose: the network demo runs many processes on two shared cores.
ARCH = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
}
# A second configuration, ~25M parameters. Random init at std 0.02 gives near-uniform next-token
# distributions (any token is about as likely as any other, so no test can tell whose tokens they
# are); std 0.1 gives the peaked distributions of a trained model.
BIG_ARCH = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.1,
}
# 600 steps: greedy success ≈ 0.34, sampled reward ≈ 0.12 — enough groups with mixed rewards for
# GRPO to learn from at once (400 steps gave 0.19 / 0.09 and a slow start).
WARM_START = {"seed": 0, "steps": 600, "batch": 64, "lr": 3e-3}


def unique_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The state dict without tied aliases (``lm_head.weight`` when tied): each storage once."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for k, v in model.state_dict().items():
        ptr = v.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[k] = v
    return out


def clone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A detached copy of every tensor: a version kept while the model it came from trains on."""
    return {k: v.detach().clone() for k, v in state.items()}


def pick_device(name: str) -> str:
    """``auto``: CUDA when torch sees one, else CPU; ``cpu``, ``cuda`` and ``cuda:N`` as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {name!r}")
    if name != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but torch sees no CUDA device")
    return name

def weights_hash(state: Mapping[str, Tensor]) -> str:
    """The network's weights hash (``p2prl.patch.hashing.weights_hash``: BLAKE3, canonical order) of
    tensors on any device (the hash reads bytes on the CPU)."""
    return str(patch_hash({k: v if v.device.type == "cpu" else v.detach().cpu() for k, v in state.items()}))


def random_qwen2(arch: Mapping[str, Any], vocab_size: int, seed: int) -> Any:
    """A random-init Qwen2 of shape ``arch`` (``ARCH``, ``BIG_ARCH``) in bf16, eval mode: the stand-in
    models of the proof and learner benchmarks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, **arch)
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()

def default_config(vocab_size: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        pad_token_id=0,  # the char vocabulary's <pad> and <eos>
        eos_token_id=1,
        bos_token_id=None,
        **ARCH,
    )


def warm_start(model: Any, tok: TextTokenizer, task: Any, cfg: Mapping[str, Any], end_id: int) -> None:
    """Supervised steps on the task's prompts (in ``tok``'s prompt format) → answer + ``end_id``, with
    loss on the answer only (fixed data order from ``cfg["seed"]``)."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    model.train()
    for _ in range(cfg["steps"]):
        draws = torch.randint(0, 2**62, (cfg["batch"], 32), generator=gen)
        seqs, starts = [], []
        for row in draws:
            prob = task.problem(row.numpy().tobytes())
            p = tok.encode_prompt(prob.prompt)
            seqs.append([*p, *tok.encode(prob.answer), end_id])
            starts.append(len(p))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, st) in enumerate(zip(seqs, starts, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, st : len(s)] = torch.tensor(s[st:])
            mask[i, : len(s)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def build_default_model(cache_dir: Path) -> Path:
    """Build (or return the cached) default model directory under ``cache_dir``.

    Deterministic for a given torch build and CPU: fixed init seed, fixed warm-start data and step
    count, one thread. The weights hash in ``p2prl_model.json`` is over the bf16 weights as saved.
    """
    from transformers import Qwen2ForCausalLM

    from p2prl.rl.evaluate import greedy_success  # rl.evaluate -> rl.engine imports this module

    out = Path(cache_dir) / DEFAULT_MODEL_NAME
    if (out / META_FILE).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = CharTokenizer()
    task = AdditionTask(digits=DIGITS)
    with torch_threads(1):
        torch.manual_seed(WARM_START["seed"])
        model = Qwen2ForCausalLM(default_config(tok.vocab_size))
        warm_start(model, tok, task, WARM_START, tok.eos_id)
        model = model.to(torch.bfloat16)
        success = greedy_success(model, tok, task, n=256, max_new_tokens=DIGITS + 2)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model.save_pretrained(str(tmp))
        tok.save(tmp)
        meta = {
            "name": DEFAULT_MODEL_NAME,
            "task": {"name": task.name, "digits": DIGITS},
            "parameters": sum(p.numel() for p in model.parameters()),
            "weights_hash": weights_hash(unique_state(model)),
            "warm_start": {**WARM_START, "greedy_success": success},
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first: keep theirs
            if not (out / META_FILE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s: greedy success %.3f, hash %s", out, success, meta["weights_hash"])
    return out


def model_meta(path: Path) -> dict[str, Any]:
    """The ``p2prl_model.json`` of a model directory built here ({} for other directories)."""
    f = Path(path) / META_FILE
    return json.loads(f.read_text()) if f.exists() else {}


def load_model(path: Path, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, TextTokenizer]:
    """Load a local HF model directory (never downloads) with its tokenizer (raw prompts), in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return model.eval(), load_tokenizer(path)
