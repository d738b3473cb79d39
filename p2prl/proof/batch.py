"""The rollout batch blob: what a miner publishes for one version, and its strict bounded decoder.

Layout (all integers little-endian): ``MAGIC`` then one zstd frame holding

- header: ``version u64 | manifest_hash 32 B | miner key 32 B | sketch_dim u8 | n_groups u32``
- per group: ``prompt index u64 | n_prompt u32 | n_rollouts u32 | prompt ids u32[n_prompt]``
- per rollout: ``n u32 | reward f64 | ids u32[n] | behaviour logprobs f32[n] | sketches u8[n * sketch_dim]``

Floats are carried as their exact IEEE bytes, so what the validator reads is bit-for-bit what the
miner computed. The blob is signed indirectly: the signed RolloutAnnouncement names its sha256
(BlobRef) and ``commitment_root``, a Merkle root over the per-rollout sketches.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

from p2prl.errors import PeerInputError
from p2prl.proof.fingerprint import SKETCH_DIM, sketch
from p2prl.reasons import VerdictReason

MAGIC = b"P2RB\x01"
_HEADER = struct.Struct("<Q32s32sBI")
_GROUP = struct.Struct("<QII")
_ROLLOUT = struct.Struct("<Id")


class BatchError(PeerInputError, ValueError):
    """A batch blob that cannot be accepted; ``reason`` is a hard ``VerdictReason``."""


@dataclass(frozen=True)
class BatchLimits:
    """Everything a peer's batch can make the decoder hold is bounded by these."""

    max_groups: int = 4096
    max_rollouts_per_group: int = 64
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 4096
    max_total_tokens: int = 1 << 21
    max_decoded_bytes: int = 64 * 1024 * 1024
    vocab_size: int = 1 << 20
    sketch_dim: int = SKETCH_DIM


@dataclass
class RolloutRecord:
    """One completion as the miner reports it."""

    completion_ids: np.ndarray  # uint32 [n]
    logprobs: np.ndarray  # float32 [n], behaviour logprobs of the sampled distribution
    reward: float
    sketches: np.ndarray  # uint8 [n, sketch_dim]


@dataclass
class GroupRecord:
    """Several completions of the miner's ``index``-th derived prompt."""

    index: int
    prompt_ids: np.ndarray  # uint32 [n_prompt]
    rollouts: list[RolloutRecord] = field(default_factory=list)


@dataclass
class RolloutBatch:
    version: int
    manifest_hash: str
    miner: bytes
    groups: list[GroupRecord]
    sketch_dim: int = SKETCH_DIM
    # the public seed of its prompts and uniforms when it is not ``manifest_hash`` (a chained batch's
    # ``chain_seed``, from its announcement: not part of the blob, set by whoever read the announcement)
    seed: str = ""

    @property
    def prompt_seed(self) -> str:
        """The hex seed its prompts (``derive_seed``) and uniforms (``sample_key``) derive from."""
        return self.seed or self.manifest_hash

    @property
    def n_rollouts(self) -> int:
        return sum(len(g.rollouts) for g in self.groups)

    @property
    def n_completion_tokens(self) -> int:
        return sum(len(r.completion_ids) for g in self.groups for r in g.rollouts)


def _ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=np.int64)
    if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() >= 2**32)):
        raise ValueError("token ids must be a flat list of uint32")
    return a.astype(np.uint32)


def encode_batch(batch: RolloutBatch, level: int = 3) -> bytes:
    """Serialize ``batch`` (deterministic bytes for a given batch and zstd level)."""
    parts = [
        _HEADER.pack(
            batch.version,
            bytes.fromhex(batch.manifest_hash),
            bytes(batch.miner),
            batch.sketch_dim,
            len(batch.groups),
        )
    ]
    for g in batch.groups:
        prompt = _ids(g.prompt_ids)
        parts += [_GROUP.pack(g.index, prompt.size, len(g.rollouts)), prompt.astype("<u4").tobytes()]
        for r in g.rollouts:
            ids = _ids(r.completion_ids)
            lps = np.asarray(r.logprobs, dtype=np.float32)
            sk = np.asarray(r.sketches, dtype=np.uint8)
            if lps.shape != ids.shape or sk.shape != (ids.size, batch.sketch_dim):
                raise ValueError("rollout arrays disagree in length")
            parts += [
                _ROLLOUT.pack(ids.size, float(r.reward)),
                ids.astype("<u4").tobytes(),
                lps.astype("<f4").tobytes(),
                sk.tobytes(),
            ]
    return MAGIC + zstandard.ZstdCompressor(level=level).compress(b"".join(parts))


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise BatchError(VerdictReason.BATCH_MALFORMED, f"truncated at byte {self.pos} (wanted {n} more)")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct) -> tuple[Any, ...]:
        return s.unpack(self.take(s.size))


def _decompress(data: bytes, limit: int) -> bytes:
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise BatchError(VerdictReason.BATCH_MALFORMED, "bad magic")
    try:
        with zstandard.ZstdDecompressor().stream_reader(data[len(MAGIC) :], read_across_frames=False) as r:
            out = r.read(limit + 1)
    except zstandard.ZstdError as e:
        raise BatchError(VerdictReason.BATCH_MALFORMED, f"zstd: {e}") from None
    if len(out) > limit:
        raise BatchError(VerdictReason.BATCH_OVERSIZED, f"decodes to more than {limit} bytes")
    return out


def decode_batch(data: bytes, limits: BatchLimits | None = None) -> RolloutBatch:
    """Parse and bound-check a batch blob; raises ``BatchError`` (never anything else) on bad input."""
    lim = limits or BatchLimits()
    rd = _Reader(_decompress(bytes(data), lim.max_decoded_bytes))
    version, mh, miner, sketch_dim, n_groups = rd.unpack(_HEADER)
    if sketch_dim != lim.sketch_dim:
        raise BatchError(VerdictReason.BATCH_MALFORMED, f"sketch_dim {sketch_dim}, expected {lim.sketch_dim}")
    if not 1 <= n_groups <= lim.max_groups:
        raise BatchError(
            VerdictReason.BATCH_OVERSIZED if n_groups else VerdictReason.BATCH_MALFORMED,
            f"{n_groups} groups",
        )
    total = 0
    groups: list[GroupRecord] = []
    for _ in range(n_groups):
        index, n_prompt, n_rollouts = rd.unpack(_GROUP)
        if not 1 <= n_prompt <= lim.max_prompt_tokens:
            raise BatchError(
                VerdictReason.BATCH_OVERSIZED if n_prompt else VerdictReason.BATCH_MALFORMED,
                f"prompt of {n_prompt} tokens",
            )
        if not 1 <= n_rollouts <= lim.max_rollouts_per_group:
            raise BatchError(
                VerdictReason.BATCH_OVERSIZED if n_rollouts else VerdictReason.BATCH_MALFORMED,
                f"{n_rollouts} rollouts",
            )
        prompt = _read_ids(rd, n_prompt, lim.vocab_size)
        g = GroupRecord(index=index, prompt_ids=prompt)
        for _ in range(n_rollouts):
            n, reward = rd.unpack(_ROLLOUT)
            if not 1 <= n <= lim.max_completion_tokens:
                raise BatchError(
                    VerdictReason.BATCH_OVERSIZED if n else VerdictReason.BATCH_MALFORMED,
                    f"completion of {n} tokens",
                )
            total += n + n_prompt
            if total > lim.max_total_tokens:
                raise BatchError(VerdictReason.BATCH_OVERSIZED, f"more than {lim.max_total_tokens} tokens")
            if not math.isfinite(reward):
                raise BatchError(VerdictReason.BATCH_MALFORMED, "reward is not finite")
            ids = _read_ids(rd, n, lim.vocab_size)
            lps = np.frombuffer(rd.take(4 * n), dtype="<f4").astype(np.float32)
            if not np.all(np.isfinite(lps)) or np.any(lps > 0):
                raise BatchError(VerdictReason.BATCH_MALFORMED, "logprobs must be finite and <= 0")
            sk = np.frombuffer(rd.take(n * sketch_dim), dtype=np.uint8).reshape(n, sketch_dim).copy()
            g.rollouts.append(RolloutRecord(ids, lps, float(reward), sk))
        groups.append(g)
    if rd.pos != len(rd.buf):
        raise BatchError(VerdictReason.BATCH_MALFORMED, f"{len(rd.buf) - rd.pos} trailing bytes")
    return RolloutBatch(version, bytes(mh).hex(), bytes(miner), groups, sketch_dim)


def _read_ids(rd: _Reader, n: int, vocab: int) -> np.ndarray:
    ids = np.frombuffer(rd.take(4 * n), dtype="<u4").astype(np.uint32)
    if ids.size and int(ids.max()) >= vocab:
        raise BatchError(
            VerdictReason.BATCH_VOCAB,
            f"token id {int(ids.max())} outside vocabulary of {vocab}",
        )
    return ids


def rollout_group(batch: RolloutBatch, gi: int, problem: Any = None) -> Any:
    """Group ``gi`` of a decoded batch as the trainer's ``RolloutGroup`` (the one conversion: the
    validator's accepted groups and the trainer's intake both use it)."""
    from p2prl.rl import Rollout, RolloutGroup

    g = batch.groups[gi]
    rolls = [
        Rollout(r.completion_ids.tolist(), r.logprobs.astype(float).tolist(), float(r.reward)) for r in g.rollouts
    ]
    return RolloutGroup(
        g.prompt_ids.tolist(), rolls, batch.version, batch.miner.hex(), problem, index=g.index,
        manifest_hash=batch.prompt_seed,
    )


def rollout_leaf(group: int, rollout: int, r: RolloutRecord) -> bytes:
    """Merkle leaf of one rollout: its position, tokens and sketches."""
    h = hashlib.sha256(b"p2prl-sketch-leaf")
    h.update(struct.pack("<II", group, rollout))
    h.update(_ids(r.completion_ids).astype("<u4").tobytes())
    h.update(np.asarray(r.sketches, dtype=np.uint8).tobytes())
    return h.digest()


def merkle_root(leaves: list[bytes]) -> bytes:
    """Binary sha256 Merkle root (odd nodes are promoted); the root of no leaves is sha256 of a tag."""
    if not leaves:
        return hashlib.sha256(b"p2prl-empty").digest()
    level = leaves
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def commitment_root(batch: RolloutBatch) -> str:
    """Hex root the miner signs in its RolloutAnnouncement: it commits to every token's sketch."""
    leaves = [rollout_leaf(gi, ri, r) for gi, g in enumerate(batch.groups) for ri, r in enumerate(g.rollouts)]
    return merkle_root(leaves).hex()


def record_from_sample(sample: Any, reward: float, manifest_hash: str, m: int = SKETCH_DIM) -> RolloutRecord:
    """A RolloutRecord from an engine ``Sample`` (needs its hidden states)."""
    if sample.hidden is None:
        raise ValueError("the engine must return hidden states to build a proof")
    ids = _ids(sample.completion_ids)
    if ids.size == 0:
        raise ValueError("empty completion")
    return RolloutRecord(
        completion_ids=ids,
        logprobs=np.asarray(sample.logprobs, dtype=np.float32),
        reward=float(reward),
        sketches=sketch(sample.hidden, manifest_hash, m),
    )


def build_batch(
    version: int,
    manifest_hash: str,
    miner_key: bytes,
    groups: Sequence[tuple[int, Sequence[int], Sequence[Any], Sequence[float]]],
    m: int = SKETCH_DIM,
    seed: str = "",
) -> RolloutBatch:
    """A miner's batch from ``(prompt index, prompt ids, engine samples, rewards)`` per group
    (``seed``: a chained batch's, when its prompts do not derive from ``manifest_hash``)."""
    out = []
    for index, prompt_ids, samples, rewards in groups:
        if len(samples) != len(rewards):
            raise ValueError("one reward per sample")
        recs = [record_from_sample(s, r, manifest_hash, m) for s, r in zip(samples, rewards, strict=True)]
        out.append(GroupRecord(index=int(index), prompt_ids=_ids(prompt_ids), rollouts=recs))
    return RolloutBatch(version, manifest_hash, bytes(miner_key), out, m, seed)
