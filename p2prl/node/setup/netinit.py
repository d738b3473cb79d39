"""``p2prl network init``: describe the base model, hash it, and sign the genesis with the trainer key.

:data:`NetworkSpec` is generated from the genesis section declarations (``p2prl.protocol.sections``):
every section field with a ``flag`` becomes a spec field (and so a ``network init`` flag) of the same
name, next to the few top-level settings below, so the flags and the genesis can never drift apart.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from p2prl.crypto import Identity, KeyFileError, load_identity, load_or_create_identity
from p2prl.node.setup.assetspecs import MODEL_FILES_ASSET, TASK_DATA_ASSET, asset_for, task_data_asset
from p2prl.node.setup.genesis import SignedGenesis, make_genesis, write_genesis
from p2prl.protocol import (
    DEFAULT_MAX_STALENESS,
    AssetSpec,
    GenerationSpec,
    Genesis,
    ModelSpec,
    PatchSpec,
    PromptSpec,
    ProofSpec,
    S3Spec,
    TaskSpec,
    is_hex,
)
from p2prl.rl import pin_task_params

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

FLAGGED_SECTIONS: tuple[type, ...] = (PromptSpec, TaskSpec, GenerationSpec, PatchSpec, S3Spec)
SectionT = TypeVar("SectionT", bound="DataclassInstance")


class SpecValues(Protocol):
    """A :data:`NetworkSpec` as this module reads it: a dataclass (``dataclasses.replace``) whose
    fields named here are read directly; the other flagged fields only through :func:`section_of`.
    NetworkSpec is made at import time, so no static type can name all of its fields."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    network_id: str
    model: Path | None
    validators: list[str]
    bootstrap: list[str]
    max_staleness: int
    task: str
    task_params: dict[str, Any]  # TaskSpec.params: a task's own JSON values, checked by the task
    chunk_size: int
    s3_bucket: str


@dataclass
class _TopLevel:
    network_id: str = field(
        default="p2prl-net", metadata={"help": "Network id (signed into every envelope)."}
    )
    model: Path | None = field(
        default=None,
        metadata={"help": "Local Hugging Face causal-LM directory (default: the built-in tiny model)."},
    )
    validators: list[str] = field(
        default_factory=list,
        metadata={"flag": "validator", "help": "Validator public key (hex) or key file."},
    )
    bootstrap: list[str] = field(default_factory=list, metadata={"help": "Bootstrap multiaddr (…/p2p/<id>)."})
    max_staleness: int = field(default=DEFAULT_MAX_STALENESS, metadata={"help": "Oldest usable rollout, in versions behind."})


def spec_name(f: dataclasses.Field[Any]) -> str:
    """The NetworkSpec field of a section field: its flag with dashes as underscores."""
    return str(f.metadata.get("flag", f.name)).replace("-", "_")


def _spec_field(f: dataclasses.Field[Any], hint: object) -> tuple[str, object, object]:
    """(name, type hint, ``field()``) of the NetworkSpec field for section field ``f``."""
    scale = f.metadata.get("scale")
    name = spec_name(f)
    if name == "task_param":
        return "task_params", dict[str, Any], field(default_factory=dict, metadata=dict(f.metadata))
    if f.default_factory is not dataclasses.MISSING:
        return name, hint, field(default_factory=f.default_factory, metadata=dict(f.metadata))
    default = f.default / scale if scale else f.default
    return name, float if scale else hint, field(default=default, metadata=dict(f.metadata))


def _make_spec() -> type:
    fields_: list[tuple[str, object, object]] = []
    for f in dataclasses.fields(_TopLevel):
        fields_.append((f.name, typing.get_type_hints(_TopLevel)[f.name], f))
    for sec in FLAGGED_SECTIONS:
        hints = typing.get_type_hints(sec)
        fields_.extend(_spec_field(f, hints[f.name]) for f in dataclasses.fields(sec) if "flag" in f.metadata)
    return dataclasses.make_dataclass("NetworkSpec", fields_, namespace={"__doc__": _SPEC_DOC})


_SPEC_DOC = "What the trainer chooses when founding a network (all of it is signed into genesis)."
NetworkSpec: type = _make_spec()


def section_of(spec: SpecValues, cls: type[SectionT], **fixed: object) -> SectionT:
    """Section ``cls`` from a NetworkSpec's flagged values (scaled ones back to integers) and ``fixed``."""
    kw: dict[str, object] = dict(fixed)
    for f in dataclasses.fields(cls):
        if "flag" not in f.metadata:
            continue
        name = "task_params" if spec_name(f) == "task_param" else spec_name(f)
        v = getattr(spec, name)
        scale = f.metadata.get("scale")
        kw[f.name] = round(v * scale) if scale else v
    return cls(**kw)


def _validator_key(v: str) -> str:
    """A validator given as 64 hex characters or as a key file."""
    s = v.strip().lower()
    if is_hex(s, 32):
        return s
    try:
        return load_identity(Path(v)).public_hex
    except KeyFileError as e:
        raise ValueError(f"validator {v!r} is neither a hex public key nor a key file ({e})") from e


_B58 = frozenset("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")
_HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")


def check_bootstrap(addr: str) -> str:
    """``addr`` if it is a dialable bootstrap multiaddr, ``/<ip4|ip6|dns…>/<host>/tcp/<port>/p2p/<peer
    id>``; else ValueError. The genesis is permanent and nodes retry its bootstrap peers forever, so
    ``127.0.0.1:4001`` or an address without the peer id is refused before anything is written."""
    example = "/ip4/203.0.113.10/tcp/4001/p2p/<trainer peer id> (`p2prl keys show KEY` prints the peer id)"
    parts = addr.strip().split("/")
    ok = (
        len(parts) == 7
        and parts[0] == ""
        and parts[1] in _HOST_PROTOCOLS
        and bool(parts[2])
        and parts[3] == "tcp"
        and parts[4].isdigit()
        and 0 < int(parts[4]) < 65536
        and parts[5] == "p2p"
        and len(parts[6]) >= 32
        and set(parts[6]) <= _B58
    )
    if not ok:
        raise ValueError(f"bootstrap address {addr!r} is not a multiaddr like {example}")
    return addr.strip()


def spec_warnings(spec: SpecValues) -> list[str]:
    """What is legal in a genesis but probably not meant (the genesis cannot be changed later)."""
    out = []
    if not spec.validators:
        out.append("no --validator: no rollout can be accepted, so this network can never train")
    if not spec.bootstrap:
        out.append("no --bootstrap: nodes find the trainer only through --bootstrap flags or S3")
    return out


def base_model_info(model_cache: Path) -> ModelSpec:
    """Build (or reuse) the default model and describe it for genesis (each node rebuilds it)."""
    # rl's model modules import torch: `p2prl network show` and the demo's start need none
    from p2prl.rl import build_default_model, config_sha256, model_meta, tokenizer_sha256

    path = build_default_model(Path(model_cache))
    meta = model_meta(path)
    return ModelSpec(
        name=meta["name"],
        source="builtin",
        architecture="Qwen2ForCausalLM",
        dtype="bfloat16",
        parameters=int(meta["parameters"]),
        weights_hash=meta["weights_hash"],
        config_sha256=config_sha256(path),
        tokenizer_sha256=tokenizer_sha256(path),
        files_sha256="",
        files_size=0,
    )


def genesis_from_spec(
    spec: SpecValues,
    trainer: Identity,
    model: ModelSpec,
    s3: S3Spec | dict[str, str] | None = None,
    stop_token_ids: tuple[int, ...] = (),
    assets: tuple[AssetSpec, ...] = (),
    proof: ProofSpec | None = None,
) -> SignedGenesis:
    """Sign the genesis of ``spec`` for ``model`` (``s3`` overrides the spec's S3 flags; ``proof``:
    pinned tolerances)."""
    if isinstance(s3, dict):
        s3 = S3Spec(**s3)
    if s3 is None and spec.s3_bucket:
        s3 = section_of(spec, S3Spec)
    return make_genesis(
        trainer,
        network_id=spec.network_id,
        model=model,
        prompt=section_of(spec, PromptSpec),
        task=section_of(spec, TaskSpec, data_sha256=_task_data_id(assets)),
        generation=section_of(spec, GenerationSpec, stop_token_ids=tuple(stop_token_ids)),
        patch=section_of(spec, PatchSpec),
        validators=[_validator_key(v) for v in spec.validators],
        bootstrap=list(spec.bootstrap),
        s3=s3,
        max_staleness=spec.max_staleness,
        assets=assets,
        proof=proof,
    )


def _task_data_id(assets: tuple[AssetSpec, ...]) -> str:
    return next((a.id for a in assets if a.name == TASK_DATA_ASSET), "")


def describe_model(
    spec: SpecValues, model_cache: Path
) -> tuple[ModelSpec, tuple[int, ...], tuple[AssetSpec, ...]]:
    """The genesis model section, stop ids and assets for ``spec`` (its ``--model`` directory, else the
    built-in model), after checking the prompt format works with the tokenizer (callers check the task).
    A directory's non-weight files become the ``model_files`` asset a joining node fetches, a
    data-backed task's file (``path=FILE``, its hash pinned first) the ``task_data`` asset."""
    # torch, as in base_model_info
    from p2prl.rl import build_default_model, describe, load_tokenizer, pack_files, stop_ids_of

    prompt = section_of(spec, PromptSpec)
    assets: tuple[AssetSpec, ...] = ()
    if spec.model is not None:
        model, stops, _ = describe(spec.model)
        path = Path(spec.model)
        assets = (asset_for(MODEL_FILES_ASSET, pack_files(path), spec.chunk_size),)
    else:
        model, path = base_model_info(model_cache), build_default_model(Path(model_cache))
        stops = stop_ids_of(path, load_tokenizer(path).tok)
    load_tokenizer(path, prompt.format, prompt.system).encode_prompt("1+1=")  # chat needs a template
    data = task_data_asset(spec.task_params, spec.chunk_size)
    return model, stops, assets + ((data,) if data is not None else ())


def with_model_defaults(spec: SpecValues, explicit: frozenset[str] = frozenset()) -> SpecValues:
    """``spec`` with the generation settings its ``--model`` implies where the user gave none
    (``explicit``: the spec fields set on the command line): the chat format when the tokenizer has a
    template, a completion bound that fits the task, the addition task's chat style
    (``p2prl.rl.gendefaults``). The built-in model's spec is returned as it is."""
    if spec.model is None:
        return spec
    from p2prl.rl import run_defaults  # torch: only a --model network needs it

    d = run_defaults(
        spec.model,
        spec.task,
        spec.task_params,
        spec.prompt_format if "prompt_format" in explicit else None,
        spec.max_new_tokens if "max_new_tokens" in explicit else 0,
    )
    return dataclasses.replace(
        spec, prompt_format=d.prompt_format, max_new_tokens=d.max_new_tokens, task_params=d.task_params
    )


def init_network(
    spec: SpecValues,
    *,
    key_path: Path,
    model_cache: Path,
    out: Path,
    pin: Callable[[Genesis], ProofSpec] | None = None,
) -> SignedGenesis:
    """Check everything first (task, model directory, prompt format), then create the trainer key if
    needed, sign and write the genesis file: a failed check writes nothing. ``pin``: the tolerances
    of a reference run on the genesis so far (``node.weights.reference``), signed into it."""
    # a data-backed task's file hash is pinned here (an unknown task or bad params fail first)
    spec = dataclasses.replace(
        spec,
        task_params=pin_task_params(spec.task, spec.task_params),
        bootstrap=[check_bootstrap(a) for a in spec.bootstrap],
    )
    model, stops, assets = describe_model(spec, model_cache)
    trainer = load_or_create_identity(key_path)
    sg = genesis_from_spec(spec, trainer, model, stop_token_ids=stops, assets=assets)
    if pin is not None:
        sg = genesis_from_spec(spec, trainer, model, stop_token_ids=stops, assets=assets, proof=pin(sg.genesis))
    write_genesis(sg, out)
    return sg
