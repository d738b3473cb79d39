"""A local Hugging Face causal-LM directory: checked, hashed, loaded, and its non-weight files packed.

What the genesis pins about a model comes from here: the hash of its config in canonical form, the
hash of its tokenizer files, the weights hash of its bf16 state, its parameter count and stop tokens.
A directory that cannot serve (no weights, no tokenizer, shards that do not add up, an architecture
transformers cannot load) raises :class:`ModelDirError` with a one-line reason before anything is
written. The non-weight files travel as one deterministic tar (:func:`pack_files`), unpacked only
after its hash matched the genesis (:func:`unpack_files` accepts nothing but known file names).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import torch

from p2prl.protocol import ModelSpec
from p2prl.rl.model import unique_state, weights_hash

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
MODEL_FILES = (CONFIG_FILE, GENERATION_FILE, *TOKENIZER_FILES)  # what the files blob may hold
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a tokenizer.json of a 256k vocabulary is ~30 MB
VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path")
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


class ModelDirError(ValueError):
    """A model directory that cannot serve as (or is not) the network's base model."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path.name} is unreadable: {e}") from e


def config_sha256(directory: Path) -> str:
    """SHA-256 of config.json in canonical form (sorted keys, no whitespace, version stamps dropped)."""
    cfg = _read_json(Path(directory) / CONFIG_FILE)
    if not isinstance(cfg, dict):
        raise ModelDirError("config.json is not an object")
    canon = {k: v for k, v in cfg.items() if k not in VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def present_files(directory: Path, names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if (Path(directory) / n).is_file())


def tokenizer_sha256(directory: Path) -> str:
    """SHA-256 over the tokenizer files present (name and content of each, in name order)."""
    h = hashlib.sha256(b"p2prl/tokenizer/v1\x00")
    for n in present_files(directory, TOKENIZER_FILES):
        data = (Path(directory) / n).read_bytes()
        h.update(n.encode() + b"\x00" + hashlib.sha256(data).digest())
    return h.hexdigest()


def pack_files(directory: Path) -> bytes:
    """The non-weight files as one deterministic tar (sorted names, zeroed owners and times)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for n in present_files(directory, MODEL_FILES):
            data = (Path(directory) / n).read_bytes()
            info = tarfile.TarInfo(n)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def unpack_files(blob: bytes, directory: Path) -> list[str]:
    """Write the files of a (hash-verified) files blob into ``directory``; only known names, regular files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            for m in tar.getmembers():
                if not m.isfile() or m.name not in MODEL_FILES or m.size > MAX_FILE_BYTES:
                    raise ModelDirError(f"files blob holds an unexpected entry {m.name!r}")
                f = tar.extractfile(m)
                assert f is not None
                (directory / m.name).write_bytes(f.read())
                names.append(m.name)
    except tarfile.TarError as e:
        raise ModelDirError(f"files blob is not a tar: {e}") from e
    if CONFIG_FILE not in names:
        raise ModelDirError("files blob has no config.json")
    return names


def check_weight_files(directory: Path) -> list[Path]:
    """The safetensors files, after checking that a sharded set adds up to its index exactly."""
    from safetensors import safe_open

    d = Path(directory)
    if (d / WEIGHTS_INDEX).is_file():
        wmap = _read_json(d / WEIGHTS_INDEX).get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise ModelDirError(f"{WEIGHTS_INDEX} has no weight_map")
        shards = sorted(set(wmap.values()))
        missing = [s for s in shards if "/" in s or not (d / s).is_file()]
        if missing:
            raise ModelDirError(f"shards named in {WEIGHTS_INDEX} are missing: {', '.join(missing[:3])}")
        found: dict[str, str] = {}
        for s in shards:
            with safe_open(str(d / s), framework="pt") as f:
                found.update(dict.fromkeys(f.keys(), s))
        if set(found) != set(wmap):
            lost = sorted(set(wmap) - set(found)) or sorted(set(found) - set(wmap))
            raise ModelDirError(f"shards do not add up to {WEIGHTS_INDEX}: e.g. {lost[0]!r}")
        return [d / s for s in shards]
    if (d / WEIGHTS_FILE).is_file():
        return [d / WEIGHTS_FILE]
    raise ModelDirError(f"{d} has no safetensors weights ({WEIGHTS_FILE} or {WEIGHTS_INDEX})")


def check_causal_lm(directory: Path) -> None:
    """config.json names a model type transformers has a causal-LM class for (a cheap check, before
    any weights load): an encoder, a vision model or a config without ``model_type`` is refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    d = Path(directory)
    check_files(d, weights=False)
    cfg = _read_json(d / CONFIG_FILE)
    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    if not isinstance(mt, str) or not mt:
        raise ModelDirError(f"{d} is not a causal LM: config.json names no model_type")
    if mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelDirError(f"{d} is not a causal LM: transformers has no causal-LM class for model_type {mt!r}")


def has_chat_template(directory: Path) -> bool:
    """Whether the directory's tokenizer carries a chat template (a file, or in tokenizer_config.json)."""
    d = Path(directory)
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    cfg = d / "tokenizer_config.json"
    return cfg.is_file() and bool(_read_json(cfg).get("chat_template"))


def has_weights(directory: Path) -> bool:
    d = Path(directory)
    return (d / WEIGHTS_FILE).is_file() or (d / WEIGHTS_INDEX).is_file()


def check_files(directory: Path, weights: bool = True) -> None:
    """The cheap checks: a config, a tokenizer, and (``weights``) safetensors weights that add up."""
    d = Path(directory)
    if not d.is_dir():
        raise ModelDirError(f"{d} is not a directory")
    if not (d / CONFIG_FILE).is_file():
        raise ModelDirError(f"{d} has no config.json")
    if not present_files(d, TOKENIZER_CORE):
        raise ModelDirError(f"{d} has no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)")
    if weights:
        check_weight_files(d)


def stop_ids_of(directory: Path, tok: Any) -> tuple[int, ...]:
    """Stop tokens: the tokenizer's eos, then generation_config.json's ``eos_token_id`` (int or list),
    then the end-of-turn/end-of-text tokens of the common chat formats the vocabulary holds as single
    tokens (:data:`END_TOKENS`): a chat model whose eos is one of them also stops at the other."""
    ids = [int(tok.eos_token_id)] if tok.eos_token_id is not None else []
    gen = Path(directory) / GENERATION_FILE
    if gen.is_file():
        eos = _read_json(gen).get("eos_token_id")
        ids.extend(e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int))
    if ids:
        vocab = tok.get_vocab()
        ids.extend(int(vocab[t]) for t in END_TOKENS if t in vocab)
    if not ids:
        raise ModelDirError("the tokenizer has no eos token and generation_config.json names none")
    return tuple(dict.fromkeys(ids))


def load_weights_model(directory: Path, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The model in ``dtype``, eval mode, local files only; every parameter must come from the files."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=dtype, local_files_only=True, output_loading_info=True
        )
    except Exception as e:  # transformers raises ValueError/KeyError/OSError/... for unknown types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"transformers cannot load {directory} as a causal LM: {first}") from e
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ModelDirError(f"the weights lack {len(missing)} tensors the model needs, e.g. {missing[0]!r}")
    return model.eval()


def model_from_config(directory: Path, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The architecture of ``directory`` with freshly initialised weights: the shape a node needs
    before its first sync overwrites every tensor from a verified anchor."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"transformers cannot build the model in {directory}: {first}") from e


def describe(directory: Path, name: str = "") -> tuple[ModelSpec, tuple[int, ...], Any]:
    """Check and hash a model directory: what the genesis pins about it, its stop ids, the bf16 model."""
    from transformers import AutoTokenizer


    d = Path(directory)
    check_files(d)
    check_causal_lm(d)
    cfg_hash = config_sha256(d)
    try:
        tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as e:
        raise ModelDirError(
            f"the tokenizer in {d} does not load: {str(e).splitlines()[0] if str(e) else e!r}"
        ) from e
    stops = stop_ids_of(d, tok)
    model = load_weights_model(d)
    files = pack_files(d)
    spec = ModelSpec(
        name=(name or d.resolve().name)[:128],
        source="hf",
        architecture=str((getattr(model.config, "architectures", None) or [type(model).__name__])[0]),
        dtype="bfloat16",
        parameters=sum(p.numel() for p in model.parameters()),
        weights_hash=weights_hash(unique_state(model)),
        config_sha256=cfg_hash,
        tokenizer_sha256=tokenizer_sha256(d),
        files_sha256=hashlib.sha256(files).hexdigest(),
        files_size=len(files),
    )
    return spec, stops, model
