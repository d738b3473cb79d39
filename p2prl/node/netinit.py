"""``p2prl network init``: build the base model, hash it, and sign the genesis with the trainer key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from p2prl.crypto.keys import KeyFileError, load_identity, load_or_create_identity
from p2prl.node.genesis import SignedGenesis, make_genesis, write_genesis


@dataclass
class NetworkSpec:
    """What the trainer chooses when founding a network (all of it is signed into genesis)."""

    network_id: str = "p2prl-net"
    task: str = "addition"
    task_params: dict[str, Any] = field(default_factory=dict)
    validators: list[str] = field(default_factory=list)  # hex keys or key-file paths
    bootstrap: list[str] = field(default_factory=list)
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_prefix: str = ""
    anchor_interval: int = 10
    chunk_size: int = 1024 * 1024
    max_staleness: int = 4
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    group_size: int = 8
    groups_per_batch: int = 8


def _validator_key(v: str) -> str:
    """A validator given as 64 hex characters or as a key file."""
    s = v.strip().lower()
    if len(s) == 64:
        try:
            bytes.fromhex(s)
            return s
        except ValueError:
            pass
    try:
        return load_identity(Path(v)).public_hex
    except KeyFileError as e:
        raise ValueError(f"validator {v!r} is neither a hex public key nor a key file ({e})") from e


def base_model_info(model_cache: Path) -> dict[str, Any]:
    """Build (or reuse) the default model and describe it for genesis (its hash pins version 0)."""
    from p2prl.rl.model import build_default_model, model_meta

    path = build_default_model(Path(model_cache))
    meta = model_meta(path)
    return {
        "name": meta["name"],
        "source": "builtin",
        "dtype": "bfloat16",
        "parameters": int(meta["parameters"]),
        "weights_hash": meta["weights_hash"],
        "tokenizer": "char",
    }


def genesis_from_spec(
    spec: NetworkSpec, trainer: Any, model: dict[str, Any], s3: dict[str, Any] | None = None
) -> SignedGenesis:
    if spec.s3_bucket and s3 is None:
        s3 = {"endpoint": spec.s3_endpoint, "bucket": spec.s3_bucket, "prefix": spec.s3_prefix}
    if not 1 <= spec.anchor_interval <= 100_000:
        raise ValueError("anchor_interval must be in 1..100000")
    if spec.group_size < 2:
        raise ValueError("group_size must be >= 2 (GRPO normalizes within a group)")
    if not 0 < spec.top_p <= 1 or spec.temperature <= 0:
        raise ValueError("temperature must be > 0 and top_p in (0, 1]")
    return make_genesis(
        trainer,
        network_id=spec.network_id,
        model=model,
        task={"name": spec.task, "params": dict(spec.task_params)},
        generation={
            "max_new_tokens": spec.max_new_tokens,
            "temperature_milli": round(spec.temperature * 1000),
            "top_p_milli": round(spec.top_p * 1000),
            "group_size": spec.group_size,
            "groups_per_batch": spec.groups_per_batch,
        },
        patch={"anchor_interval": spec.anchor_interval, "chunk_size": spec.chunk_size, "codec": "p2prl-v1"},
        validators=[_validator_key(v) for v in spec.validators],
        bootstrap=list(spec.bootstrap),
        s3=s3,
        max_staleness=spec.max_staleness,
    )


def init_network(spec: NetworkSpec, *, key_path: Path, model_cache: Path, out: Path) -> SignedGenesis:
    """Create the trainer key if needed, describe the base model, sign and write the genesis file."""
    from p2prl.rl.tasks import pin_task_params

    # fail early on an unknown task or bad params; a data-backed task's file hash is pinned here
    spec = replace(spec, task_params=pin_task_params(spec.task, spec.task_params))
    trainer = load_or_create_identity(key_path)
    sg = genesis_from_spec(spec, trainer, base_model_info(model_cache))
    write_genesis(sg, out)
    return sg
