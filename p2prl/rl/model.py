"""The default model: a tiny Qwen2-style char-level LM the project built itself, plus local loading.

No pretrained weights can be fetched, so the project trained one from a fixed seed, warm-started on
the default task with a short supervised run (fixed data, fixed step count) until it answers some
problems but far from all — the regime where RL has something to learn. Its bf16 weights ship with
the package (``rl/data``) because a genesis names them by hash and that training run's float
arithmetic is not the same bits on every CPU (an AVX2, an AVX-512 and an AMX build each gave another
hash): ``build_default_model`` writes them out as an ordinary HF model directory (config.json,
model.safetensors, the char vocabulary as a ``tokenizers`` tokenizer.json) loaded like any other, plus
``p2prl_model.json`` recording its weights hash and warm-start result. ``train_default_model`` is the
recipe that made them (``python -m p2prl.rl.retrain`` reruns it and says whether this CPU gives the
shipped bits).
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
# The shipped weights (trained by ``train_default_model`` on an AVX-512 CPU with torch 2.13, one
# thread), their network weights hash, and the greedy success measured when they were trained.
DEFAULT_WEIGHTS_FILE = Path(__file__).parent / "data" / f"{DEFAULT_MODEL_NAME}.safetensors"
DEFAULT_WEIGHTS_HASH = "93806ea9a7408c861830a120c9b2d9a205ffca9f6d2c371b00b33cc61cee1bf1"
DEFAULT_GREEDY_SUCCESS = 0.3359375


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


def train_default_model() -> Any:
    """The recipe the shipped weights came from: fixed init seed, fixed warm-start data and step
    count, one thread, then bf16. The same bits only for the same torch build and CPU kernels."""
    from transformers import Qwen2ForCausalLM

    tok = CharTokenizer()
    with torch_threads(1):
        torch.manual_seed(WARM_START["seed"])
        model = Qwen2ForCausalLM(default_config(tok.vocab_size))
        warm_start(model, tok, AdditionTask(digits=DIGITS), WARM_START, tok.eos_id)
    return model.to(torch.bfloat16).eval()


def shipped_default_model() -> Any:
    """The default model with the shipped weights, checked against ``DEFAULT_WEIGHTS_HASH``."""
    from safetensors.torch import load_file
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(default_config(CharTokenizer().vocab_size)).to(torch.bfloat16).eval()
    state = load_file(str(DEFAULT_WEIGHTS_FILE))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"{DEFAULT_WEIGHTS_FILE}: missing {missing}, unexpected {unexpected}")
    got = weights_hash(unique_state(model))
    if got != DEFAULT_WEIGHTS_HASH:
        raise ValueError(f"{DEFAULT_WEIGHTS_FILE}: weights hash {got}, not {DEFAULT_WEIGHTS_HASH}")
    return model


def build_default_model(cache_dir: Path) -> Path:
    """Write (or return the cached) default model directory under ``cache_dir``.

    The weights are the shipped ones, the same bits on every machine. A cached directory of another
    hash (one this package trained on the machine before the weights shipped) is replaced.
    """
    out = Path(cache_dir) / DEFAULT_MODEL_NAME
    if model_meta(out).get("weights_hash") == DEFAULT_WEIGHTS_HASH:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = CharTokenizer()
    task = AdditionTask(digits=DIGITS)
    model = shipped_default_model()
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
            "weights_hash": DEFAULT_WEIGHTS_HASH,
            "warm_start": {**WARM_START, "greedy_success": DEFAULT_GREEDY_SUCCESS},
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        if out.exists() and model_meta(out).get("weights_hash") != DEFAULT_WEIGHTS_HASH:
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=out.parent))
            try:
                os.replace(out, stale / "model")
            except OSError:  # another process moved it first
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first: keep theirs
            if model_meta(out).get("weights_hash") != DEFAULT_WEIGHTS_HASH:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote %s: hash %s", out, DEFAULT_WEIGHTS_HASH)
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
