"""The genesis sections as typed, frozen dataclasses, parsed once from the signed body.

Each section declares its fields with their types; :func:`parse_section` checks a body against that
declaration (every key present, no unknown key, every value of its type and within its bound), so code
past the genesis boundary reads attributes and never guesses a default for a missing key.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from p2prl.protocol.blobs import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, BlobRef
from p2prl.protocol.fields import bad_body, check_hex

MAX_STR = 4096  # system prompts can be a paragraph; everything else is far shorter
MAX_ITEMS = 64
HEX_FIELDS = {"weights_hash": 32, "config_sha256": 32, "tokenizer_sha256": 32}

T = TypeVar("T")


def _check(name: str, tp: Any, v: Any) -> Any:
    """``v`` as a value of type ``tp`` (str, int, bool, tuple[int|str, ...], dict of scalars)."""
    origin = typing.get_origin(tp)
    if tp is str:
        if not isinstance(v, str) or len(v) > MAX_STR:
            raise bad_body(f"{name} must be a string of at most {MAX_STR} chars")
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise bad_body(f"{name} must be a boolean")
        return v
    if tp is int:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 2**62:
            raise bad_body(f"{name} must be a non-negative integer")
        return v
    if origin is tuple:
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}
        if not isinstance(v, list | tuple) or len(v) > MAX_ITEMS:
            raise bad_body(f"{name} must be a list of at most {MAX_ITEMS} items")
        return tuple(_check(name, item, x) for x in v)
    if origin is dict:
        if not isinstance(v, dict) or len(v) > MAX_ITEMS:
            raise bad_body(f"{name} must be an object of at most {MAX_ITEMS} keys")
        for k, x in v.items():
            if (
                not isinstance(k, str)
                or not isinstance(x, str | int | bool)
                or (isinstance(x, str) and len(x) > MAX_STR)
            ):
                raise bad_body(f"{name} values must be strings, integers or booleans")
        return dict(v)
    raise TypeError(f"unsupported section field type {tp!r}")  # a declaration bug, not a peer's


def parse_section(cls: type[T], body: Any, what: str) -> T:
    """Build section ``cls`` from ``body`` with every field checked; missing or extra keys are errors."""
    if not isinstance(body, dict):
        raise bad_body(f"{what} must be an object")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    extra = set(body) - set(names)
    if extra:
        raise bad_body(f"{what} has unknown keys {sorted(extra)}")
    kw = {}
    for n in names:
        if n not in body:
            raise bad_body(f"{what}.{n} is missing")
        kw[n] = _check(f"{what}.{n}", hints[n], body[n])
        if n in HEX_FIELDS and kw[n]:
            check_hex(kw[n], HEX_FIELDS[n], f"{what}.{n}")
    try:
        return cls(**kw)
    except ValueError as e:
        raise bad_body(f"{what}: {e}") from e


def section_body(sec: Any) -> dict[str, Any]:
    """The JSON body of a section (tuples as lists, dicts copied)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(sec):
        v = getattr(sec, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v
    return out


@dataclass(frozen=True)
class AssetSpec:
    """A file the network needs besides the weights (the model's non-weight files, a task's data),
    named by the content-addressed blob that carries it; fetched, verified and re-served like any blob."""

    name: str
    id: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]

    def __post_init__(self) -> None:
        self.ref  # noqa: B018 - checks id, chunk hashes and their count against the size

    @property
    def ref(self) -> Any:
        body = {"id": self.id, "size": self.size, "chunk_size": self.chunk_size, "chunks": list(self.chunks)}
        return BlobRef.from_body(body)


@dataclass(frozen=True)
class ModelSpec:
    """The base model every node must hold at version 0.

    ``source`` is ``builtin`` (the project's tiny model, rebuilt locally) or ``hf`` (a Hugging Face
    directory). ``files_sha256`` names the content-addressed blob of the directory's non-weight
    files (config, tokenizer, chat template, generation config); version 0's anchor carries the weights.
    """

    name: str
    source: str
    architecture: str
    dtype: str
    parameters: int
    weights_hash: str
    config_sha256: str
    tokenizer_sha256: str
    files_sha256: str
    files_size: int

    def __post_init__(self) -> None:
        if self.source not in ("builtin", "hf"):
            raise ValueError(f"source must be builtin or hf, not {self.source!r}")
        if self.dtype != "bfloat16":
            raise ValueError("dtype must be bfloat16 (the patch codec's element type)")
        for name, nbytes in HEX_FIELDS.items():  # required: these pin what every node must hold
            check_hex(getattr(self, name), nbytes, name)
        if self.files_sha256:
            check_hex(self.files_sha256, 32, "files_sha256")
        if self.source == "builtin" and (self.files_sha256 or self.files_size):
            # every node rebuilds the built-in model's files: a files blob would be fetched for nothing
            raise ValueError("a builtin model has files_sha256 \"\" and files_size 0")


@dataclass(frozen=True)
class PromptSpec:
    """How a task's prompt text becomes token ids: ``raw`` (encode as is) or ``chat`` (the tokenizer's
    chat template around one user turn, after ``system`` when non-empty, with the generation prompt)."""

    format: str = field(default="raw", metadata={"flag": "prompt-format", "help": "raw or chat."})
    system: str = field(
        default="", metadata={"flag": "system-prompt", "help": "System prompt for the chat format."}
    )

    def __post_init__(self) -> None:
        if self.format not in ("raw", "chat"):
            raise ValueError(f"prompt format must be raw or chat, not {self.format!r}")
        if self.system and self.format != "chat":
            raise ValueError("a system prompt needs --prompt-format chat")


@dataclass(frozen=True)
class TaskSpec:
    """The task, its parameters and, for a data-backed task, the data file's sha256 ("" when none)."""

    name: str = field(default="addition", metadata={"flag": "task", "help": "Task name."})
    params: dict[str, Any] = field(
        default_factory=dict, metadata={"flag": "task-param", "help": "Task parameter KEY=VALUE."}
    )
    data_sha256: str = ""

    def __post_init__(self) -> None:
        if self.data_sha256:
            check_hex(self.data_sha256, 32, "data_sha256")


@dataclass(frozen=True)
class GenerationSpec:
    """Sampling settings every miner and validator uses; ``stop_token_ids`` end a completion."""

    max_new_tokens: int = field(
        default=8, metadata={"flag": "max-new-tokens", "help": "Completion length bound."}
    )
    temperature_milli: int = field(
        default=1000, metadata={"flag": "temperature", "scale": 1000, "help": "Sampling temperature."}
    )
    top_p_milli: int = field(
        default=1000, metadata={"flag": "top-p", "scale": 1000, "help": "Nucleus sampling mass."}
    )
    group_size: int = field(default=8, metadata={"flag": "group-size", "help": "Completions per prompt."})
    groups_per_batch: int = field(
        default=8, metadata={"flag": "groups-per-batch", "help": "Prompts per announced batch."}
    )
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.max_new_tokens <= 65536:
            raise ValueError("max_new_tokens must be in 1..65536")
        if self.temperature_milli < 1 or not 1 <= self.top_p_milli <= 1000:
            raise ValueError("temperature must be > 0 and top_p in (0, 1]")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (GRPO normalizes within a group)")
        if self.groups_per_batch < 1:
            raise ValueError("groups_per_batch must be >= 1")

    @property
    def temperature(self) -> float:
        return self.temperature_milli / 1000

    @property
    def top_p(self) -> float:
        return self.top_p_milli / 1000


@dataclass(frozen=True)
class PatchSpec:
    """How versions travel: a full anchor every ``anchor_interval`` versions, blobs in chunks."""

    anchor_interval: int = field(
        default=10, metadata={"flag": "anchor-interval", "help": "A full checkpoint every N versions."}
    )
    chunk_size: int = field(
        default=1024 * 1024, metadata={"flag": "chunk-size", "help": "Blob chunk size in bytes."}
    )

    def __post_init__(self) -> None:
        if not 1 <= self.anchor_interval <= 100_000:
            raise ValueError("anchor_interval must be in 1..100000")
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:  # what a BlobRef may carry
            raise ValueError(f"chunk_size must be in {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE} (16 KiB..16 MiB)")


@dataclass(frozen=True)
class S3Spec:
    """The S3 mirror/fallback location (no credentials: those are each node's own)."""

    endpoint: str = field(
        default="", metadata={"flag": "s3-endpoint", "help": "S3 endpoint URL (empty: AWS)."}
    )
    bucket: str = field(default="", metadata={"flag": "s3-bucket", "help": "S3 bucket (empty: no S3)."})
    prefix: str = field(default="", metadata={"flag": "s3-prefix", "help": "Key prefix inside the bucket."})
    region: str = field(default="us-east-1", metadata={"flag": "s3-region", "help": "S3 region."})


PPM = 1_000_000
MAX_RUNGS = 8
MAX_ENGINES = 8


@dataclass(frozen=True)
class ProofSpec:
    """Tolerances the founder measured in a reference run before signing the genesis: honest batches
    mined at version 0 by each engine in ``engines`` (the network's miners' engines, on the founder's
    device), judged by a validator's forward pass; ``tokens`` checked tokens of the run, all engines
    together. A validator that does not measure its own (``--no-calibrate-tolerances``: its miners run on
    another device) judges with these, and so does every validator while its own calibration runs,
    instead of code defaults loose enough for any pair of engines. All values in parts per million
    (the genesis is integers only); see docs/PROTOCOL.md §3 and docs/PROOF.md."""

    fingerprint_tol_ppm: int
    fingerprint_tol_rollout_ppm: int
    logprob_tol_mean_ppm: int
    logprob_tol_max_ppm: int
    sampling_margin_ppm: int
    sampling_rungs_ppm: tuple[int, ...]  # each rung's fraction of the margin
    sampling_rung_rates_ppm: tuple[int, ...]  # each rung's honest rate
    engines: tuple[str, ...]
    tokens: int

    def __post_init__(self) -> None:
        for name in ("fingerprint_tol_ppm", "fingerprint_tol_rollout_ppm", "sampling_margin_ppm"):
            if not 1 <= getattr(self, name) <= PPM:
                raise ValueError(f"{name} must be in 1..{PPM} (at most 1.0)")
        for name in ("logprob_tol_mean_ppm", "logprob_tol_max_ppm"):
            if not 1 <= getattr(self, name) <= 100 * PPM:
                raise ValueError(f"{name} must be in 1..{100 * PPM} (at most 100 nats)")
        rungs, rates = self.sampling_rungs_ppm, self.sampling_rung_rates_ppm
        if not 1 <= len(rungs) <= MAX_RUNGS or len(rates) != len(rungs):
            raise ValueError(f"1..{MAX_RUNGS} sampling rungs, each with its rate")
        if not all(1 <= x <= PPM for x in (*rungs, *rates)):
            raise ValueError(f"each sampling rung and rate must be in 1..{PPM}")
        if not 1 <= len(self.engines) <= MAX_ENGINES or not all(0 < len(e) <= 64 for e in self.engines):
            raise ValueError(f"engines: 1..{MAX_ENGINES} names of at most 64 characters")


__all__ = [
    "AssetSpec",
    "GenerationSpec",
    "ModelSpec",
    "PatchSpec",
    "PromptSpec",
    "ProofSpec",
    "S3Spec",
    "TaskSpec",
    "parse_section",
    "section_body",
]
