"""The node's weights on disk and in memory: base model, saved versions, hashes.

Weights are kept as a plain state dict (bf16 CPU tensors, tied aliases dropped). A saved version is a
safetensors file plus a small JSON pointer written last, so a crash leaves either the old or the new
version, never a half-written one, and a restarted node re-checks the hash before trusting it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2prl.atomicfile import write_atomic
from p2prl.patch.hashing import sorted_names, weights_hash

log = logging.getLogger(__name__)
State = dict[str, torch.Tensor]
CURRENT = "current.json"


@dataclass
class Weights:
    """A complete, verified set of weights at one version."""

    version: int
    hash: str
    state: State


def clone_state(state: State) -> State:
    return {k: v.detach().clone() for k, v in state.items()}


def sha256_of_state(state: State) -> str:
    """SHA-256 over the same canonical serialization as the BLAKE3 weights hash (for reports)."""
    h = hashlib.sha256()
    h.update(b"p2prl/weights/v1\x00" + struct.pack("<I", len(state)))
    for name in sorted_names(state):
        t = state[name].detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        n = name.encode()
        dtype = str(t.dtype).removeprefix("torch.")
        dims = tuple(t.shape)
        h.update(struct.pack("<I", len(n)) + n + bytes([len(dtype)]) + dtype.encode())
        h.update(bytes([len(dims)]) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<Q", len(raw)))
        h.update(raw)
    return h.hexdigest()


def load_base_model(cache_dir: Path) -> tuple[Any, Any, State]:
    """The default base model (built once into ``cache_dir``), its tokenizer and its bf16 state."""
    from p2prl.rl.model import build_default_model, load_model, unique_state

    path = build_default_model(Path(cache_dir))
    model, tok = load_model(path, torch.bfloat16)
    return model, tok, clone_state(unique_state(model))


def save_weights(w: Weights, directory: Path, keep: int = 2) -> Path:
    """Write ``w`` under ``directory`` and point ``current.json`` at it; keeps the newest ``keep`` files."""
    from safetensors.torch import save_file

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
