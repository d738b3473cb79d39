"""The weights on disk: the genesis model's files and base model, checked against the genesis, and
the saved versions.

A saved version is a safetensors file plus a small JSON pointer written last, so a crash leaves
either the old or the new version, never a half-written one, and a restarted node re-checks the hash
before trusting it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from p2prl.atomicfile import write_atomic
from p2prl.node.weights.version import State, Weights
from p2prl.patch import weights_hash
from p2prl.protocol import Genesis, ModelSpec
from p2prl.rl import (
    ModelDirError,
    Tokenizer,
    build_default_model,
    check_files,
    clone_state,
    config_sha256,
    has_weights,
    load_tokenizer,
    load_weights_model,
    model_from_config,
    tokenizer_sha256,
    unique_state,
)

log = logging.getLogger(__name__)
CURRENT = "current.json"


def model_dir_for(
    spec: ModelSpec, model_dir: Path | None, cache_dir: Path, fetch: Callable[[Path], Path] | None = None
) -> Path:
    """Where the genesis model's files are: the built-in model (built once), the operator's
    ``--model`` copy, or the files fetched into the cache (now, by ``fetch(target)``, if missing).
    Raises FileNotFoundError when there are none and nothing to fetch them with."""
    if spec.source == "builtin":
        return build_default_model(Path(cache_dir))
    if model_dir is not None:
        return Path(model_dir)
    cached = fetched_model_dir(spec, cache_dir)
    if (cached / "config.json").is_file():
        return cached
    if fetch is not None:
        return fetch(cached)
    raise FileNotFoundError(f"the genesis model {spec.name!r} is not on this machine: pass --model DIR")


def fetched_model_dir(spec: ModelSpec, cache_dir: Path) -> Path:
    """The cache directory a model fetched from the network lives in (named by its files hash)."""
    return Path(cache_dir) / f"{spec.name}-{spec.files_sha256[:16]}"


def verify_model_files(directory: Path, spec: ModelSpec, weights: bool = True) -> None:
    """The directory's config and tokenizer must hash to the genesis' (a one-line error names which)."""
    check_files(directory, weights)
    for part, got, want in (
        ("config.json", config_sha256(directory), spec.config_sha256),
        ("tokenizer files", tokenizer_sha256(directory), spec.tokenizer_sha256),
    ):
        if got != want:
            raise ModelDirError(f"{directory}: {part} differ from the genesis ({got[:12]}… != {want[:12]}…)")


def load_base_model(
    g: Genesis,
    cache_dir: Path,
    model_dir: Path | None = None,
    device: str = "cpu",
    strict: bool = True,
    fetch: Callable[[Path], Path] | None = None,
    share: bool = False,
) -> tuple[torch.nn.Module, Tokenizer, State, str]:
    """The genesis base model on ``device``, its prompt-formatting tokenizer, its bf16 CPU state and
    that state's weights hash. Config and tokenizer must match the genesis; so must the weights when
    ``strict`` (a miner may instead start unverified and sync from an anchor, as one does whose
    files came from the network without weights: version 0's anchor carries those). With ``share``
    on the CPU the state is the model's own tensors (one copy, patched in place: node/live.py)."""
    path = model_dir_for(g.model, model_dir, cache_dir, fetch)
    weighted = has_weights(path) or strict
    verify_model_files(path, g.model, weighted)
    model = load_weights_model(path, torch.bfloat16) if weighted else model_from_config(path)
    state = unique_state(model) if share and device == "cpu" else clone_state(unique_state(model))
    h = weights_hash(state)
    if strict and h != g.model.weights_hash:
        raise ModelDirError(
            f"{path}: weights differ from the genesis ({h[:12]}… != {g.model.weights_hash[:12]}…)"
        )
    tok = load_tokenizer(path, g.prompt.format, g.prompt.system, g.generation.stop_token_ids)
    return model.to(device), tok, state, h


def save_weights(w: Weights, directory: Path, keep: int = 2) -> Path:
    """Write ``w`` under ``directory`` and point ``current.json`` at it; keeps the newest ``keep`` files.
    Only verified weights are saved: a restart trusts what ``current.json`` records."""
    from safetensors.torch import save_file

    if w.hash is None:
        raise ValueError(f"version {w.version} is unverified: not saved")

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"v{w.version:012d}.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in w.state.items()}, str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    ptr = directory / CURRENT
    write_atomic(ptr, json.dumps({"version": w.version, "hash": w.hash, "file": path.name}).encode())
    files = sorted(directory.glob("v*.safetensors"))
    for old in files[:-keep]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def load_saved_weights(directory: Path) -> Weights | None:
    """The version ``current.json`` points at, if its file exists and hashes to what was recorded."""
    from safetensors.torch import load_file

    ptr = Path(directory) / CURRENT
    try:
        meta = json.loads(ptr.read_text())
        version, expect, name = int(meta["version"]), str(meta["hash"]), str(meta["file"])
        if "/" in name or name.startswith("."):
            raise ValueError("bad file name")
        state = load_file(str(Path(directory) / name))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, OSError, TypeError) as e:
        log.warning("saved weights in %s unusable (%s); starting over", directory, e)
        return None
    got = weights_hash(state)
    if got != expect:
        log.warning("saved weights v%d hash %s != recorded %s; ignoring them", version, got[:12], expect[:12])
        return None
    return Weights(version, got, state)
