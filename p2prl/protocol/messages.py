"""Typed bodies of the envelope types (DESIGN §2), each with a size bound and a strict parser.

``encode_message`` signs a typed object into an envelope; ``decode_message`` verifies an
envelope and parses its body into the right type, so code past it only ever sees checked data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from p2prl.crypto import (
    Envelope,
    EnvelopeError,
    Identity,
    canonical_bytes,
    canonical_loads,
    open_envelope,
    seal,
)
from p2prl.protocol.blobs import BlobRef
from p2prl.protocol.fields import (
    MessageError,
    bad_body,
    bool_field,
    dict_field,
    hex_field,
    int_field,
    is_hex,
    is_multiaddr,
    list_field,
    req,
    str_field,
)
from p2prl.protocol.sections import (
    AssetSpec,
    GenerationSpec,
    ModelSpec,
    PatchSpec,
    PromptSpec,
    ProofSpec,
    S3Spec,
    TaskSpec,
    parse_section,
    section_body,
)
from p2prl.reasons import InputReason

MAX_ENVELOPE_BYTES = 512 * 1024
MAX_VERSION = 2**40
# A network's max_staleness (versions a rollout may lag the trainer) when its genesis is made without
# one: the default every part takes from here.
DEFAULT_MAX_STALENESS = 4
ROLES = ("trainer", "miner", "validator")
KINDS = ("delta", "anchor")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Genesis:
    """The network's founding document, signed by the trainer; every node pins its trainer key."""

    TYPE: ClassVar[str] = "genesis"
    MAX_BYTES: ClassVar[int] = 256 * 1024

    network_id: str
    trainer: str  # hex public key
    model: ModelSpec
    prompt: PromptSpec
    task: TaskSpec
    generation: GenerationSpec
    patch: PatchSpec
    validators: tuple[str, ...]
    bootstrap: tuple[str, ...]
    s3: S3Spec | None
    max_staleness: int
    assets: tuple[AssetSpec, ...] = ()  # blobs named by model.files_sha256 / task.data_sha256
    created_ms: int = field(default_factory=now_ms)
    # tolerances pinned from the founder's reference run; None: none (the body then has no "proof"
    # key, so a genesis without them is signed exactly as before)
    proof: ProofSpec | None = None

    MAX_ASSETS: ClassVar[int] = 16

    def asset(self, blob_id: str) -> AssetSpec:
        """The asset carried by blob ``blob_id`` (a KeyError when the genesis names none)."""
        for a in self.assets:
            if a.id == blob_id:
                return a
        raise KeyError(blob_id)

    def to_body(self) -> dict[str, Any]:
        return {
            "network_id": self.network_id,
            "trainer": self.trainer,
            "model": section_body(self.model),
            "prompt": section_body(self.prompt),
            "task": section_body(self.task),
            "generation": section_body(self.generation),
            "patch": section_body(self.patch),
            "validators": list(self.validators),
            "bootstrap": list(self.bootstrap),
            "s3": section_body(self.s3) if self.s3 is not None else None,
            "max_staleness": self.max_staleness,
            "assets": [section_body(a) for a in self.assets],
            "created_ms": self.created_ms,
        } | ({} if self.proof is None else {"proof": section_body(self.proof)})

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> Genesis:
        extra = set(b) - {f.name for f in fields(cls)}
        if extra:  # a field this version does not know would be signed but silently ignored
            raise bad_body(f"genesis has unknown keys {sorted(extra)}")
        validators = list_field(b, "validators", 64)
        for v in validators:
            if not is_hex(v, 32):
                raise bad_body("validators must be hex public keys")
        bootstrap = list_field(b, "bootstrap", 64)
        if not all(isinstance(a, str) and len(a) < 512 and is_multiaddr(a) for a in bootstrap):
            raise bad_body("bootstrap must be multiaddr strings")
        s3 = req(b, "s3")
        return cls(
            network_id=str_field(b, "network_id", 64),
            trainer=hex_field(b, "trainer", 32),
            model=parse_section(ModelSpec, req(b, "model"), "model"),
            prompt=parse_section(PromptSpec, req(b, "prompt"), "prompt"),
            task=parse_section(TaskSpec, req(b, "task"), "task"),
            generation=parse_section(GenerationSpec, req(b, "generation"), "generation"),
            patch=parse_section(PatchSpec, req(b, "patch"), "patch"),
            validators=tuple(validators),
            bootstrap=tuple(bootstrap),
            s3=parse_section(S3Spec, s3, "s3") if s3 is not None else None,
            max_staleness=int_field(b, "max_staleness", 0, 1_000_000),
            assets=tuple(parse_section(AssetSpec, a, "asset") for a in list_field(b, "assets", cls.MAX_ASSETS)),
            created_ms=int_field(b, "created_ms"),
            proof=parse_section(ProofSpec, b["proof"], "proof") if "proof" in b else None,
        )


@dataclass(frozen=True)
class PatchManifest:
    """Version ``version`` of the weights: a delta from ``base_version`` or a full anchor."""

    TYPE: ClassVar[str] = "patch_manifest"
    MAX_BYTES: ClassVar[int] = 256 * 1024
    # the newest manifests a trainer re-sends in one burst (gossip is lossy; a late joiner needs the
    # newest anchor and the deltas after it) and whose blobs it lists as held: far below a peer's
    # per-forwarder burst (p2prl.net.config.Limits.peer_msg_burst) and Heartbeat.SENT_HOLDS
    REANNOUNCED: ClassVar[int] = 64

    version: int
    base_version: int  # == version for an anchor
    base_hash: str  # weights hash (blake3 hex) the delta applies to; "" for an anchor
    result_hash: str  # weights hash after applying
    kind: str  # "delta" | "anchor"
    codec: str
    blob: BlobRef
    anchor_version: int  # newest anchor at or below this version (the slow path's start)
    created_ms: int = field(default_factory=now_ms)

    def to_body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "base_version": self.base_version,
            "base_hash": self.base_hash,
            "result_hash": self.result_hash,
            "kind": self.kind,
            "codec": self.codec,
            "blob": self.blob.to_body(),
            "anchor_version": self.anchor_version,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> PatchManifest:
        kind = str_field(b, "kind", 16, KINDS)
        m = cls(
            version=int_field(b, "version", 0, MAX_VERSION),
            base_version=int_field(b, "base_version", 0, MAX_VERSION),
            base_hash=hex_field(b, "base_hash", 32) if kind == "delta" else str_field(b, "base_hash", 0),
            result_hash=hex_field(b, "result_hash", 32),
            kind=kind,
            codec=str_field(b, "codec", 32),
            blob=BlobRef.from_body(b.get("blob")),
            anchor_version=int_field(b, "anchor_version", 0, MAX_VERSION),
            created_ms=int_field(b, "created_ms"),
        )
        if kind == "delta" and m.base_version != m.version - 1:
            raise bad_body("a delta must take version-1 to version")
        if kind == "anchor" and (m.base_version != m.version or m.anchor_version != m.version):
            raise bad_body("an anchor's base_version and anchor_version are its own version")
        if m.anchor_version > m.version:
            raise bad_body("anchor_version after version")
        return m


@dataclass(frozen=True)
class RolloutAnnouncement:
    """A miner's batch of rollout groups for one version, stored as a blob."""

    TYPE: ClassVar[str] = "rollout_announcement"
    MAX_BYTES: ClassVar[int] = 64 * 1024

    version: int
    manifest_hash: str  # result_hash of the version used: its weights, and a chain start's public seed
    blob: BlobRef
    groups: int
    commitment_root: str  # sha256 hex over the fingerprint commitments
    created_ms: int = field(default_factory=now_ms)
    # a chained batch: the blob id of this key's previous batch and the digest of the trainer's
    # ``Receipts`` that listed it; its prompts and uniforms are seeded by ``chain_seed`` of the two.
    # Both empty: a chain start, seeded by ``manifest_hash`` (trained by nobody: docs/PROTOCOL.md §14)
    prev: str = ""
    receipts: str = ""

    @property
    def chained(self) -> bool:
        return bool(self.prev)

    def to_body(self) -> dict[str, Any]:
        body = {
            "version": self.version,
            "manifest_hash": self.manifest_hash,
            "blob": self.blob.to_body(),
            "groups": self.groups,
            "commitment_root": self.commitment_root,
            "created_ms": self.created_ms,
        }
        if self.prev or self.receipts:
            body["prev"], body["receipts"] = self.prev, self.receipts
        return body

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> RolloutAnnouncement:
        chained = "prev" in b or "receipts" in b
        return cls(
            version=int_field(b, "version", 0, MAX_VERSION),
            manifest_hash=hex_field(b, "manifest_hash", 32),
            blob=BlobRef.from_body(b.get("blob")),
            groups=int_field(b, "groups", 1, 4096),
            commitment_root=hex_field(b, "commitment_root", 32),
            created_ms=int_field(b, "created_ms"),
            prev=hex_field(b, "prev", 32) if chained else "",
            receipts=hex_field(b, "receipts", 32) if chained else "",
        )


@dataclass(frozen=True)
class Receipts:
    """The trainer's receipts of the rollout announcements it received since its last ``Receipts``
    (``protocol.chains.receipt_id`` of signer and blob id, sorted, distinct). Sent every few seconds
    whether or not the trainer trained, so chains never wait on a version; the random ``nonce`` makes
    the envelope's digest, which seeds each receipted key's next batch, unforeseeable."""

    TYPE: ClassVar[str] = "receipts"
    MAX_BYTES: ClassVar[int] = 192 * 1024
    MAX_ENTRIES: ClassVar[int] = 4096

    entries: tuple[str, ...]
    nonce: str
    created_ms: int = field(default_factory=now_ms)

    def to_body(self) -> dict[str, Any]:
        return {"entries": list(self.entries), "nonce": self.nonce, "created_ms": self.created_ms}

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> Receipts:
        entries = list_field(b, "entries", cls.MAX_ENTRIES)
        if not all(is_hex(e, 16) for e in entries):
            raise bad_body("entries must be 16-byte receipt ids")
        if entries != sorted(set(entries)):
            raise bad_body("entries must be sorted and distinct")
        return cls(entries=tuple(entries), nonce=hex_field(b, "nonce", 16), created_ms=int_field(b, "created_ms"))


@dataclass(frozen=True)
class GroupVerdict:
    """One group's judgement inside a ``Verdict``: its position in the batch, accepted or not, and why.

    ``reason`` is a ``VerdictReason`` value; any code of up to 64 characters is carried, so a
    validator that knows a newer reason is not refused (the trainer acts only on the hard ones).
    Keys other than these three are ignored.
    """

    MAX_INDEX: ClassVar[int] = 4095  # a batch holds at most 4096 groups (RolloutAnnouncement.groups)
    MAX_REASON: ClassVar[int] = 64

    index: int
    accepted: bool
    reason: str

    def to_body(self) -> dict[str, Any]:
        return {"index": self.index, "accepted": self.accepted, "reason": str(self.reason)}

    @classmethod
    def from_body(cls, g: Any) -> GroupVerdict:
        if not isinstance(g, dict):
            raise bad_body("group verdict must be an object")
        return cls(
            index=int_field(g, "index", 0, cls.MAX_INDEX),
            accepted=bool_field(g, "accepted"),
            reason=str_field(g, "reason", cls.MAX_REASON),
        )


@dataclass(frozen=True)
class Verdict:
    """A validator's judgement of one rollout blob: per-group accept/reject with reason codes.

    ``announcement`` is the sha256 of the announcement envelope judged: it binds the verdict to that
    signed announcement, so another key announcing the same blob id can never borrow it.
    """

    TYPE: ClassVar[str] = "verdict"
    MAX_BYTES: ClassVar[int] = 128 * 1024
    MAX_GROUPS: ClassVar[int] = 4096

    blob_id: str
    miner: str
    version: int
    groups: tuple[GroupVerdict, ...]
    announcement: str = ""  # sha256 hex of the judged announcement envelope (required on the wire)
    created_ms: int = field(default_factory=now_ms)

    @property
    def accepted(self) -> int:
        return sum(1 for g in self.groups if g.accepted)

    def to_body(self) -> dict[str, Any]:
        return {
            "blob_id": self.blob_id,
            "miner": self.miner,
            "version": self.version,
            "groups": [g.to_body() for g in self.groups],
            "announcement": self.announcement,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> Verdict:
        groups = list_field(b, "groups", cls.MAX_GROUPS)
        return cls(
            blob_id=hex_field(b, "blob_id", 32),
            miner=hex_field(b, "miner", 32),
            version=int_field(b, "version", 0, MAX_VERSION),
            groups=tuple(GroupVerdict.from_body(g) for g in groups),
            announcement=hex_field(b, "announcement", 32),
            created_ms=int_field(b, "created_ms"),
        )


@dataclass(frozen=True)
class Scores:
    """A validator's per-miner scores over its sliding window of versions (valid unique rollouts)."""

    TYPE: ClassVar[str] = "scores"
    MAX_BYTES: ClassVar[int] = 128 * 1024

    version: int
    window: int
    scores: dict[str, int]  # miner hex key -> score
    created_ms: int = field(default_factory=now_ms)

    def to_body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "window": self.window,
            "scores": dict(self.scores),
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> Scores:
        scores = dict_field(b, "scores")
        if len(scores) > 4096:
            raise bad_body("too many miners in scores")
        for k, v in scores.items():
            if not is_hex(k, 32) or not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad_body("scores must map hex keys to non-negative integers")
        return cls(
            version=int_field(b, "version", 0, MAX_VERSION),
            window=int_field(b, "window", 1, 1_000_000),
            scores=scores,
            created_ms=int_field(b, "created_ms"),
        )


@dataclass(frozen=True)
class Heartbeat:
    """Liveness, version and what a peer holds (so others know whom to ask for which chunks)."""

    TYPE: ClassVar[str] = "heartbeat"
    MAX_BYTES: ClassVar[int] = 64 * 1024
    MAX_ADDRS: ClassVar[int] = 16
    MAX_HOLDS: ClassVar[int] = 512
    MAX_STATS: ClassVar[int] = 64
    # what a node puts in one (inside the bounds above, so no peer refuses ours) and takes from one
    SENT_HOLDS: ClassVar[int] = 256  # the newest blob ids it holds
    SENT_STATS: ClassVar[int] = 32  # counters, first come
    HINTED_HOLDS: ClassVar[int] = 256  # provider hints one peer's heartbeat may add (bounded work each)

    role: str
    version: int
    peer_id: str
    addrs: tuple[str, ...]
    holds: tuple[str, ...]  # blob ids held complete
    stats: dict[str, int]
    created_ms: int = field(default_factory=now_ms)

    def to_body(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "version": self.version,
            "peer_id": self.peer_id,
            "addrs": list(self.addrs),
            "holds": list(self.holds),
            "stats": dict(self.stats),
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_body(cls, b: dict[str, Any]) -> Heartbeat:
        addrs = list_field(b, "addrs", cls.MAX_ADDRS)
        holds = list_field(b, "holds", cls.MAX_HOLDS)
        if not all(isinstance(a, str) and len(a) < 512 for a in addrs):
            raise bad_body("addrs must be multiaddr strings")
        for h in holds:
            if not is_hex(h, 32):
                raise bad_body("holds must be blob ids")
        stats = dict_field(b, "stats")
        if len(stats) > cls.MAX_STATS or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in stats.values()
        ):
            raise bad_body(f"stats must be at most {cls.MAX_STATS} integers")
        return cls(
            role=str_field(b, "role", 16, ROLES),
            version=int_field(b, "version", 0, MAX_VERSION),
            peer_id=str_field(b, "peer_id", 128),
            addrs=tuple(addrs),
            holds=tuple(holds),
            stats=stats,
            created_ms=int_field(b, "created_ms"),
        )


MESSAGE_TYPES: dict[str, Any] = {
    t.TYPE: t for t in (Genesis, PatchManifest, RolloutAnnouncement, Receipts, Verdict, Scores, Heartbeat)
}
Message = Genesis | PatchManifest | RolloutAnnouncement | Receipts | Verdict | Scores | Heartbeat


def encode_message(identity: Identity, network: str, msg: Message) -> bytes:
    """Sign ``msg`` into an envelope; refuses one that its type's size bound or parser would reject."""
    type(msg).from_body(canonical_loads(canonical_bytes(msg.to_body())))
    raw = seal(identity, network, msg.TYPE, msg.to_body())
    if len(raw) > msg.MAX_BYTES:
        raise MessageError(InputReason.OVERSIZED, f"{msg.TYPE} of {len(raw)} bytes exceeds {msg.MAX_BYTES}")
    return raw


def decode_message(
    data: bytes,
    network: str,
    *,
    expected_type: str | None = None,
    allowed_signers: set[bytes] | frozenset[bytes] | None = None,
) -> tuple[Envelope, Message]:
    """Verify an envelope and parse its body; raises EnvelopeError or MessageError (both carry ``reason``)."""
    env = open_envelope(
        data,
        network,
        max_bytes=MAX_ENVELOPE_BYTES,
        expected_type=expected_type,
        allowed_signers=allowed_signers,
    )
    cls = MESSAGE_TYPES.get(env.type)
    if cls is None:
        raise EnvelopeError(InputReason.UNKNOWN_TYPE, env.type)
    if len(data) > cls.MAX_BYTES:
        raise EnvelopeError(InputReason.OVERSIZED, f"{env.type} of {len(data)} bytes exceeds {cls.MAX_BYTES}")
    return env, cls.from_body(env.body)
