"""The validator's checks of a miner's rollout batch, each failure named by a stable reason code.

Order: cheap checks first (blob hash, version, header, commitment root, prompts, rewards, sizes,
duplicates) over every rollout, then batched teacher-forced forward passes over ``checked_per_group``
rollouts of each surviving group (picked after receipt from the validator's secret) and every repeat,
from which the fingerprint, the behaviour logprobs and the distribution of the chosen tokens are
checked. A group is accepted only when every check of it passes. Reasons in ``HARD_FAILURES``
(``p2prl.reasons``) prove misbehaviour (an honest miner never produces them) and zero the miner's
score window; the others (stale, a version this validator does not hold, a blob that does not match
its announcement) are not the miner's fault for sure and only drop the batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from p2prl.lru import LRU
from p2prl.proof.batch import (
    BatchError,
    BatchLimits,
    RolloutBatch,
    commitment_root,
    decode_batch,
    rollout_group,
)
from p2prl.proof.fingerprint import SKETCH_DIM
from p2prl.proof.recompute import Job, fisher_log_pvalues, iter_rollout_stats
from p2prl.proof.sides import Off, Side, SideRecord, judge_sides, off_positions
from p2prl.protocol import (
    DEFAULT_MAX_STALENESS,
    PPM,
    GenerationSpec,
    Genesis,
    GroupVerdict,
    ProofSpec,
    RolloutAnnouncement,
    Verdict,
    chain_seed,
    receipt_id,
)
from p2prl.reasons import HARD_FAILURES
from p2prl.reasons import VerdictReason as R
from p2prl.rl import binom_log_sf, derive_seed, sample_key, uniforms


@dataclass(frozen=True)
class ValidatorConfig:
    """The network's rules a batch is held to, as the genesis states them, and this validator's own
    tolerances and bounds. The default tolerances suit engines whose honest drift is up to ~2.5% of
    the hidden state (the 24M configuration on CPU); a network sets its own with ``proof.calibrate``."""

    # the genesis's: sampling settings, completion length, group size and groups per batch
    generation: GenerationSpec
    max_staleness: int = DEFAULT_MAX_STALENESS  # the genesis's
    # off, a batch of any group count up to limits.max_groups passes (calibration and the tests judge
    # batches of their own sizes); a network's validator holds every batch to generation.groups_per_batch
    fixed_group_count: bool = True
    # a miner's batches for a version must use its prompt indices 0, 1, 2, ... in order, each batch
    # starting where the last one judged here ended: it cannot pick which of its prompts to answer
    contiguous_indices: bool = True
    # fingerprint: relative error of the hidden state, estimated from the sketches. Honest engines
    # differ from the validator's forward either nowhere but a rare position (a bf16 rounding that
    # went the other way: one such position can lift a short rollout's rms to ~0.03–0.05) or
    # everywhere by a steady amount (other kernels); a cheaper model differs everywhere. So the batch
    # is judged by a high quantile of its per-position errors, which rare honest outliers cannot
    # move, and a rollout by its rms without its largest eighth of positions (recompute.trimmed_rms)
    fingerprint_tol: float = 0.05  # the fingerprint_quantile of the batch's per-position rms errors
    fingerprint_quantile: float = 0.9
    fingerprint_tol_rollout: float = 0.08  # one rollout's trimmed rms (gross lies)
    positions_per_rollout: int = 64  # 0 = every position
    # rollouts per group recomputed with the model (0 = all), picked after receipt like the positions,
    # and more, a round over the groups at a time, until checked_tokens completion tokens are covered:
    # the sampling check's power grows with the tokens it sees (a temperature-0.8 sampler misses ~4%
    # of its uniforms: 512 tokens catch it in > 99% of batches; the demo's 4-token completions then
    # need every rollout, 64-token ones 2 per group). The cheap checks (prompt, reward, length,
    # duplicates) always cover every rollout
    checked_per_group: int = 2
    checked_tokens: int = 512
    # behaviour logprobs vs recomputed
    logprob_tol_mean: float = 0.1
    logprob_tol_max: float = 0.4
    # a rollout fails (hard) when its mean error passes logprob_tol_mean or its largest passes this
    # factor of logprob_tol_max: the honest tail on unlikely tokens is heavy (SmolLM2-135M: 0.516 once
    # in 10,240 rollouts against a calibrated 0.59), nothing between the two proves a lie, and what a
    # lie there can do the trainer bounds (it clips each token's ratio and leaves out any token more
    # than max_logprob_gap off). A rollout there is accepted and counted (``logprob_tail_rollouts``):
    # dropping its group instead would hand every miner a soft drop at will
    logprob_hard_factor: float = 2.0
    # chosen tokens: Fisher's combination of per-token tail probabilities. One rollout below
    # distribution_alpha drops its group (an honest miner loses a group once per 1/alpha rollouts);
    # the whole batch below distribution_batch_alpha is a hard failure (honest: once per 1e12 batches)
    distribution_alpha: float = 1e-6
    distribution_batch_alpha: float = 1e-12
    # verifiable sampling (rl.sampling): a token whose public uniform lies more than sampling_margin
    # outside its interval under the validator's distribution is a miss; honest numerics make misses
    # at most at sampling_miss_rate, so a batch whose misses are beyond what that rate gives with
    # probability sampling_alpha was not drawn from its uniforms (sharpened, re-drawn, picked)
    # (0.05 uncalibrated: across engines and devices; calibration sets it from this engine's own honest
    # distances, 0.002 at the least)
    sampling_margin: float = 0.05
    sampling_miss_rate: float = 1e-4
    sampling_alpha: float = 1e-9
    # where inside the margin the uniforms fall: at a position whose uniform lies within the margin of
    # another token's interval a miner may take either token and never miss, so one that steers those
    # choices (toward reward) puts uniforms outside their intervals by up to the margin far more often
    # than honest rounding does. Rung k counts the tokens whose uniform lies more than
    # sampling_margin * sampling_rungs[k] outside; honest numerics do so at a rate of at most
    # sampling_rung_rates[k], and a batch beyond what that rate gives at sampling_alpha / len(rungs)
    # fails hard as sampling. Uncalibrated: vLLM's CPU build against transformers on a random 12M
    # model (the flattest distributions measured, docs/PROOF.md), twice its rates; calibration
    # measures them on this engine
    sampling_rungs: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625)
    sampling_rung_rates: tuple[float, ...] = (0.002, 0.03, 0.08, 0.2)
    # which side a miner took where its token is not this validator's pick (``proof.sides``): at up to
    # side_checks such positions of a batch's recomputed rollouts (picked secretly) the rollout is
    # continued with this validator's model and the same uniforms and the rewards compared; a key
    # whose record of sides won and lost over about its last side_window decided positions is beyond
    # even odds at sampling_alpha fails hard as sampling (steering toward reward). 0 turns it off.
    # Positions within honest reach (below) are judged only while at most side_dense of the batch's
    # checked tokens are off this validator's picks: where honest drift is denser (vLLM against
    # transformers on the 24M configuration, 14%) the few judged are lost among it and each costs a
    # generation (there it tripled the verification time for no power)
    side_checks: int = 8
    side_dense: float = 0.05
    # a position whose uniform lies more than side_reach * sampling_margin outside the chosen token's
    # interval (and within the margin) is beyond what honest rounding reached in calibration, which
    # sets the margin at four times the farthest honest distance it saw: such positions are judged
    # after the misses and before the rest, the farthest first, however dense the drift (the choice
    # left a steering key where drift is dense is then what honest rounding produces there)
    side_reach: float = 0.25
    side_window: int = 256
    side_keys: int = 1 << 16
    # a repeated (prompt, completion) is a copy when its probability under the model is below this
    # (two honest draws of it then collide with probability < copy_max_prob**2 per pair)
    copy_max_prob: float = 1e-9
    seen_capacity: int = 1 << 20
    forward_tokens: int = 8192  # padded tokens per batched forward
    # the forward in float32 from the model's bf16 weights (recompute.in_float32) instead of in bf16:
    # on a CPU without bf16 kernels (oneDNN's; AVX2) torch emulates bf16 matmuls, and SmolLM2-135M's
    # forward took 11.2 s in bf16 against 3.2 s in float32. Calibration measures honest drift against
    # whichever forward judges, so tolerances follow it (pinned ones were measured on the founder's).
    # Off by default: on the default model bf16 numerics are near exact and float32 is what drifts,
    # and the wider tolerances let int8 weights through (docs/benchmarks/proof.md)
    forward_float32: bool = False
    sketch_dim: int = SKETCH_DIM
    limits: BatchLimits = field(default_factory=BatchLimits)

    def __post_init__(self) -> None:
        if len(self.sampling_rungs) != len(self.sampling_rung_rates):
            raise ValueError("sampling_rungs and sampling_rung_rates must be as long as each other")
        if not all(0 < f <= 1 for f in self.sampling_rungs) or not all(0 < r <= 1 for r in self.sampling_rung_rates):
            raise ValueError("each rung must be in (0, 1] of the margin and each rate in (0, 1]")

    @property
    def logprob_fail_at(self) -> float:
        """The largest logprob error a rollout may carry before it fails ``logprob`` (hard)."""
        return self.logprob_hard_factor * self.logprob_tol_max

    @classmethod
    def from_genesis(cls, g: Genesis, **local: Any) -> ValidatorConfig:
        """The genesis's rules with this validator's ``local`` settings (tolerances, sampling); the
        tolerances the genesis pins (``g.proof``, the founder's reference run) replace the defaults."""
        pinned = {} if g.proof is None else pinned_tolerances(g.proof)
        return cls(generation=g.generation, max_staleness=g.max_staleness, **{**pinned, **local})

    def at_least(self, floor: ValidatorConfig) -> ValidatorConfig:
        """These tolerances, each no tighter than ``floor``'s (a calibrated validator in a network whose
        genesis pins the founder's reference run: the miners' engines it names stay accepted)."""
        rates = self.sampling_rung_rates
        if floor.sampling_rungs == self.sampling_rungs:
            rates = tuple(max(a, b) for a, b in zip(rates, floor.sampling_rung_rates, strict=True))
        return dataclasses.replace(
            self,
            **{k: max(getattr(self, k), getattr(floor, k)) for k in PINNED_SCALARS},
            sampling_rung_rates=rates,
        )

    def pinned(self, engines: tuple[str, ...], tokens: int) -> ProofSpec:
        """These tolerances as a genesis pins them (parts per million, rounded up: never tighter)."""
        up = _ppm_up
        return ProofSpec(
            fingerprint_tol_ppm=up(self.fingerprint_tol),
            fingerprint_tol_rollout_ppm=up(self.fingerprint_tol_rollout),
            logprob_tol_mean_ppm=up(self.logprob_tol_mean),
            logprob_tol_max_ppm=up(self.logprob_tol_max),
            sampling_margin_ppm=up(self.sampling_margin),
            sampling_rungs_ppm=tuple(round(f * PPM) for f in self.sampling_rungs),
            sampling_rung_rates_ppm=tuple(up(r) for r in self.sampling_rung_rates),
            engines=engines,
            tokens=tokens,
        )


# the tolerances a genesis pins besides the rungs (ProofSpec), as ValidatorConfig names them
PINNED_SCALARS = ("fingerprint_tol", "fingerprint_tol_rollout", "logprob_tol_mean", "logprob_tol_max", "sampling_margin")


def _ppm_up(x: float) -> int:
    """``x`` in parts per million, rounded up (a pinned tolerance is never tighter than measured)."""
    return max(1, math.ceil(x * PPM - 1e-6))


def pinned_tolerances(p: ProofSpec) -> dict[str, Any]:
    """ValidatorConfig fields from a genesis's pinned tolerances."""
    return {
        "fingerprint_tol": p.fingerprint_tol_ppm / PPM,
        "fingerprint_tol_rollout": p.fingerprint_tol_rollout_ppm / PPM,
        "logprob_tol_mean": p.logprob_tol_mean_ppm / PPM,
        "logprob_tol_max": p.logprob_tol_max_ppm / PPM,
        "sampling_margin": p.sampling_margin_ppm / PPM,
        "sampling_rungs": tuple(x / PPM for x in p.sampling_rungs_ppm),
        "sampling_rung_rates": tuple(x / PPM for x in p.sampling_rung_rates_ppm),
    }


@dataclass
class CheckStats:
    """What the model checks of one batch measured, against the tolerances: read by calibration
    (``proof.calibrate``), the benchmark and logs. All zero when no rollout was recomputed."""

    fingerprint_err_max: float = 0.0  # the worst rollout's (trimmed) rms fingerprint error
    fingerprint_rms_max: float = 0.0  # the worst rollout's plain rms (reported only)
    fingerprint_err_group_max: float = 0.0  # the worst group's (rms over all its checked positions)
    fingerprint_err_group_min: float = 0.0  # the best group's
    logprob_err_max: float = 0.0  # the largest per-token behaviour logprob error
    distribution_logp_min: float = 0.0  # the least likely rollout's Fisher log p-value
    distribution_batch_logp: float = 0.0  # the whole batch's Fisher log p-value
    fingerprint_err_quantile: float = 0.0  # the batch's per-position error at fingerprint_quantile
    sampling_tokens: int = 0  # tokens whose uniforms were checked
    sampling_misses: int = 0  # of them, how many lay beyond sampling_margin outside their interval
    sampling_dist_max: float = 0.0  # the farthest a uniform lay outside its token's interval
    # the least likely rung count under its honest rate (log binomial tail; 0 with nothing outside)
    sampling_rung_logp: float = 0.0
    # sides (proof.sides): of the positions judged, where the miner's rollout earned more / less than the
    # validator's continuation, and the key's record's log p-value after this batch (0: nothing decided)
    side_positions: int = 0  # recomputed positions whose token is not this validator's pick
    side_judged: int = 0  # of them, judged
    side_won: int = 0
    side_lost: int = 0
    side_logp: float = 0.0
    rollouts_picked: int = 0  # the secret sample plus every repeat
    rollouts_recomputed: int = 0  # fewer than picked when a hard failure stopped the checks
    rollouts_float32: int = 0  # of them, computed again in float32 because they looked off in bf16
    logprob_tail_rollouts: int = 0  # of them, accepted with a largest logprob error past logprob_tol_max
    # every checked token's distance, for calibration (not reported)
    sampling_dists: np.ndarray | None = field(default=None, repr=False, metadata={"report": False})
    # each recomputed rollout's rms fingerprint error and largest logprob error, for calibration's tails
    rollout_fp: list[float] = field(default_factory=list, repr=False, metadata={"report": False})
    rollout_lp_max: list[float] = field(default_factory=list, repr=False, metadata={"report": False})

    def add_rollout(self, res: dict[str, float]) -> None:
        """Fold in one recomputed rollout's statistics (``recompute.iter_rollout_stats``)."""
        self.rollouts_recomputed += 1
        self.rollouts_float32 += int(res.get("float32_rechecked", 0))
        self.fingerprint_err_max = max(self.fingerprint_err_max, res["fp_rollout"])
        self.fingerprint_rms_max = max(self.fingerprint_rms_max, res.get("fp_rms", res["fp_rollout"]))
        self.logprob_err_max = max(self.logprob_err_max, res["lp_max"])
        self.distribution_logp_min = min(self.distribution_logp_min, res["dist_logp"])
        self.rollout_fp.append(float(res["fp_rollout"]))
        self.rollout_lp_max.append(float(res["lp_max"]))

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self) if f.metadata.get("report", True)}


@dataclass
class BatchVerdict:
    groups: list[GroupVerdict]
    valid_groups: list[Any]  # p2prl.rl.types.RolloutGroup
    hard_failure: bool = False
    unique_rollouts: int = 0
    stats: CheckStats = field(default_factory=CheckStats)

    @property
    def accepted_rollouts(self) -> int:
        return sum(len(g.rollouts) for g in self.valid_groups)

    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.reason] = out.get(g.reason, 0) + 1
        return out


def failing_count(n: int, rate: float, alpha: float) -> int:
    """The fewest of ``n`` tokens past a bound honest numerics cross at ``rate`` that fail a batch
    (``P(Binomial(n, rate) >= m) < alpha``); ``n + 1`` when none do."""
    log_alpha = math.log(alpha)
    m = 1
    while m <= n and binom_log_sf(m, n, rate) >= log_alpha:
        m += 1
    return m


def rung_counts(d: np.ndarray, cfg: ValidatorConfig) -> list[int]:
    """Per rung, the tokens whose uniform lies more than ``sampling_margin * rung`` outside."""
    return [int(np.count_nonzero(d > cfg.sampling_margin * f)) for f in cfg.sampling_rungs]


def rung_log_sf(d: np.ndarray, cfg: ValidatorConfig) -> float:
    """The smallest log probability, over the rungs, that honest numerics put at least this many of
    the ``len(d)`` checked uniforms past the rung (binomial at the rung's rate); 0 with none past."""
    out = 0.0
    for c, rate in zip(rung_counts(d, cfg), cfg.sampling_rung_rates, strict=True):
        if c:
            out = min(out, binom_log_sf(c, len(d), rate))
    return out


# (manifest hash, model) of a version, or None when the validator does not hold it
VersionSource = Callable[[int], "tuple[str, Any] | None"]


class SeenIndex:
    """Bounded LRU of ``sha256(prompt ‖ completion)`` -> (miner key, blob id) of its first sighting."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: LRU[bytes, tuple[bytes, str]] = LRU(capacity)

    @staticmethod
    def key(prompt_ids: np.ndarray, completion_ids: np.ndarray) -> bytes:
        h = hashlib.sha256(np.asarray(prompt_ids, dtype="<u4").tobytes())
        h.update(b"\xff\xff\xff\xff")
        h.update(np.asarray(completion_ids, dtype="<u4").tobytes())
        return h.digest()

    def get(self, key: bytes) -> tuple[bytes, str] | None:
        v = self._d.get(key)
        if v is not None:
            self._d.touch(key)
        return v

    def add(self, key: bytes, miner: bytes, blob_id: str) -> None:
        if key in self._d:
            return
        self._d[key] = (miner, blob_id)

    def __len__(self) -> int:
        return len(self._d)


def fisher_log_pvalue(log_tails: np.ndarray) -> float:
    """log P(χ²(2n) ≥ -2 Σ log π): Fisher's combination of n per-token tail probabilities π."""
    return fisher_log_pvalue_sum(float(np.sum(log_tails)), int(log_tails.size))


def fisher_log_pvalue_sum(log_tail_sum: float, n: int) -> float:
    """Fisher's combination from the sum of n log tail probabilities (so batches combine rollouts)."""
    return float(fisher_log_pvalues(np.array([log_tail_sum]), np.array([n]))[0])


class RolloutValidator:
    """Checks miners' batches against the model of the version they claim.

    ``versions(v)`` returns ``(manifest hash, model)`` for a version the validator holds. Fingerprint
    positions come from ``position_secret`` (random unless given, e.g. a signature by the validator's
    key) hashed with the blob id, so the miner cannot know them when it commits.
    """

    def __init__(
        self,
        versions: VersionSource,
        tokenizer: Any,
        task: Any,
        config: ValidatorConfig,
        position_secret: bytes | None = None,
        started_at: int | None = None,
        receipts: Callable[[str], frozenset[str] | None] | None = None,
    ) -> None:
        self.versions = versions
        # the entries of the trainer's ``Receipts`` of a digest, when held: what a chained batch's
        # seed is read from (none: chained batches are not judged, ``unknown_receipts``)
        self.receipts = receipts
        self.tokenizer = tokenizer
        self.task = task
        self.config = config
        self.position_secret = position_secret if position_secret is not None else os.urandom(32)
        self.seen = SeenIndex(self.config.seen_capacity)
        # (prompt seed, miner, prompt index) already accepted: a miner earns each derived prompt once
        self.used_slots: LRU[tuple[str, bytes, int], None] = LRU(self.config.seen_capacity)
        # (version, miner) -> the next prompt index a chain start of that miner must start at
        self.next_index: LRU[tuple[int, bytes], int] = LRU(self.config.seen_capacity)
        # per key, the sides it won and lost where its tokens were not this validator's picks
        self.sides = SideRecord(self.config.side_window, self.config.side_keys)
        # the current version when this validator started (default: at its first batch of a version it
        # holds, so a node still catching up does not count as started); it saw the
        # batches of later versions from their start, of earlier ones maybe not
        self.started_at = started_at

    @classmethod
    def for_model(
        cls, model: Any, tokenizer: Any, task: Any, version: int, manifest_hash: str, **kw: Any
    ) -> RolloutValidator:
        """A validator holding one version's model."""
        return cls(lambda v: (manifest_hash, model) if v == version else None, tokenizer, task, **kw)

    # -- the whole batch -------------------------------------------------------------------------
    def check(
        self, announcement: RolloutAnnouncement, miner_key: bytes, batch_bytes: bytes, current_version: int
    ) -> BatchVerdict:
        """Judge a batch whose signed announcement ``decode_message`` already verified."""
        ann, cfg = announcement, self.config
        n = ann.groups

        def unread(reason: str, hard: bool = False) -> BatchVerdict:  # indices unknown: bridge them
            self.pass_over(ann, miner_key)
            return reject_all(n, reason, hard=hard)

        if cfg.fixed_group_count and n != cfg.generation.groups_per_batch:  # signed: before any work
            return unread(R.GROUP_COUNT, hard=True)
        if len(batch_bytes) != ann.blob.size or hashlib.sha256(batch_bytes).hexdigest() != ann.blob.id:
            return unread(R.BLOB_MISMATCH)
        if ann.version > current_version:
            return unread(R.FUTURE_VERSION)
        if current_version - ann.version > cfg.max_staleness:
            return reject_all(n, R.STALE)
        held = self.versions(ann.version)
        if held is None:
            return unread(R.UNKNOWN_VERSION)
        manifest_hash, model = held
        if manifest_hash != ann.manifest_hash:
            return unread(R.MANIFEST_MISMATCH)
        seed = self.seed_of(ann, miner_key)
        if seed in (R.UNKNOWN_RECEIPTS, R.NOT_RECEIPTED):
            return reject_all(n, seed, hard=seed in HARD_FAILURES)
        if self.started_at is None:  # the first batch it can judge: a validator still catching up
            self.started_at = current_version  # must not expect versions begun before from index 0
        try:
            batch = decode_batch(batch_bytes, self._limits())
        except BatchError as e:
            return unread(e.reason, hard=True)
        if (
            batch.version != ann.version
            or batch.manifest_hash != ann.manifest_hash
            or batch.miner != miner_key
        ):
            return unread(R.HEADER_MISMATCH, hard=True)
        if ann.chained:
            batch.seed = seed
        if len(batch.groups) != n:
            return unread(R.GROUP_COUNT, hard=True)
        if commitment_root(batch) != ann.commitment_root:
            return unread(R.COMMITMENT_MISMATCH, hard=True)
        order = self._index_order(batch)
        if order != R.OK:
            return reject_all(n, order, hard=order in HARD_FAILURES)
        return self._check_groups(batch, model, ann.blob.id)

    def seed_of(self, ann: RolloutAnnouncement, miner_key: bytes) -> str:
        """The public seed of an announced batch's prompts and uniforms: a chain start's manifest
        hash, a chained batch's ``chain_seed`` once the trainer's ``Receipts`` it names are held and
        list its previous batch under this key (else ``unknown_receipts``, soft, or ``not_receipted``,
        hard: a key claiming a receipt it was not given chooses its seed)."""
        if not ann.chained:
            return ann.manifest_hash
        entries = self.receipts(ann.receipts) if self.receipts is not None else None
        if entries is None:
            return R.UNKNOWN_RECEIPTS
        if receipt_id(miner_key, ann.prev) not in entries:
            return R.NOT_RECEIPTED
        return chain_seed(ann.receipts, ann.prev)

    def pass_over(self, announcement: RolloutAnnouncement, miner_key: bytes) -> None:
        """Advance the miner's expected prompt index past an announced batch this validator could not
        read (not fetched, not decodable, or of a version it did not hold): the ``groups`` its signed
        announcement names count as used, so the miner's next batch is judged on its own and a fault
        of the network or of this validator costs that one batch (docs/PROTOCOL.md, "Index
        continuity"). A version this validator did not see begin is left alone: the next batch it
        reads sets the start. A chained batch has prompts of its own: nothing to bridge."""
        if announcement.chained:
            return
        key = (announcement.version, miner_key)
        expected = self.next_index.get(key)
        if expected is None:
            if self.started_at is None or announcement.version <= self.started_at:
                return
            expected = 0
        self.next_index.put(key, expected + announcement.groups)

    def _index_order(self, batch: RolloutBatch) -> str:
        """Prompt indices must be consecutive within the batch and continue the miner's last judged
        batch of this version (from 0): skipping a batch after seeing its prompts or samples then
        costs every later batch of the version here. A gap is soft (a batch lost on the way to this
        validator makes one); reusing an accepted index is caught per group as ``duplicate_index``.
        Versions older than this validator's start are judged from the first batch it sees (a restart
        must not drop a miner's version in progress)."""
        if not self.config.contiguous_indices:
            return R.OK
        first = batch.groups[0].index
        if [g.index for g in batch.groups] != list(range(first, first + len(batch.groups))):
            return R.INDEX_ORDER
        if batch.seed:  # a chained batch's seed is its own: its prompts are 0, 1, … of it
            return R.OK if first == 0 else R.INDEX_ORDER
        key = (batch.version, batch.miner)
        # a version that began before this validator started: its first batch of a miner sets the start
        since = 0 if self.started_at is None or batch.version > self.started_at else first
        expected = self.next_index.get(key, since)
        if first > expected or (first < expected and (batch.prompt_seed, batch.miner, first) not in self.used_slots):
            return R.INDEX_GAP
        self.next_index.put(key, max(expected, first + len(batch.groups)))
        return R.OK

    def _limits(self) -> BatchLimits:
        cfg = self.config
        lim, gen = cfg.limits, cfg.generation
        vocab = getattr(self.tokenizer, "vocab_size", lim.vocab_size)
        return BatchLimits(
            max_groups=min(lim.max_groups, gen.groups_per_batch) if cfg.fixed_group_count else lim.max_groups,
            max_rollouts_per_group=min(lim.max_rollouts_per_group, gen.group_size),
            max_prompt_tokens=lim.max_prompt_tokens,
            max_completion_tokens=min(lim.max_completion_tokens, gen.max_new_tokens),
            max_total_tokens=lim.max_total_tokens,
            max_decoded_bytes=lim.max_decoded_bytes,
            vocab_size=min(lim.vocab_size, vocab),
            sketch_dim=cfg.sketch_dim,
        )

    # -- per group: the phases, in order -------------------------------------------------------
    def _check_groups(self, batch: RolloutBatch, model: Any, blob_id: str) -> BatchVerdict:
        """Judge each group: the cheap checks of what the miner claims over every rollout, repeats,
        then the model checks of the picked rollouts, the whole batch's token distribution and each
        group's fingerprint. ``reasons`` holds each group's verdict so far; a phase only judges
        groups still ``ok``."""
        reasons, problems = self._check_claims(batch)
        unique, keys, repeats = self._find_repeats(batch, reasons)
        todo = self._pick_rollouts(batch, blob_id, reasons, repeats)
        stats = CheckStats(rollouts_picked=len(todo))
        fp, tails, pos_errs, dists, off = self._check_rollouts(
            batch, model, blob_id, todo, repeats, reasons, stats
        )
        self._check_batch_distribution(tails, reasons, stats)
        self._group_fingerprints(fp, stats)
        self._check_batch_fingerprint(pos_errs, reasons, stats)
        self._check_batch_sampling(dists, reasons, stats)
        self._check_sides(batch, model, blob_id, off, problems, reasons, stats)
        verdict = self._verdict(batch, reasons, problems, unique, stats)
        self._remember(batch, verdict, keys, blob_id)
        return verdict

    def _check_claims(self, batch: RolloutBatch) -> tuple[list[str], list[Any]]:
        """Shape and content of every group without the model: its prompt index is new, its size is
        the genesis group size, its prompt is the one derived for it, and every completion's length,
        stop tokens and reward are what the task gives. Returns the reasons and the tasks' problems."""
        cfg = self.config
        reasons: list[str] = [R.OK] * len(batch.groups)
        problems: list[Any] = [None] * len(batch.groups)
        seen_idx: set[int] = set()
        for gi, g in enumerate(batch.groups):
            slot = (batch.prompt_seed, batch.miner, g.index)
            if g.index in seen_idx or slot in self.used_slots:
                reasons[gi] = R.DUPLICATE_INDEX
                continue
            seen_idx.add(g.index)
            if len(g.rollouts) != cfg.generation.group_size:
                reasons[gi] = R.GROUP_SIZE
                continue
            problem = self.task.problem(derive_seed(batch.prompt_seed, batch.miner, g.index))
            problems[gi] = problem
            if self.tokenizer.encode_prompt(problem.prompt) != g.prompt_ids.tolist():
                reasons[gi] = R.PROMPT_MISMATCH
                continue
            for r in g.rollouts:
                ids = r.completion_ids.tolist()
                if len(ids) > cfg.generation.max_new_tokens or set(ids[:-1]) & set(self.tokenizer.stop_ids):
                    reasons[gi] = R.LENGTH
                    break
                if self.task.reward(problem, self.tokenizer.decode(ids)) != r.reward:
                    reasons[gi] = R.REWARD
                    break
        return reasons, problems

    def _find_repeats(
        self, batch: RolloutBatch, reasons: list[str]
    ) -> tuple[list[int], dict[bytes, int], dict[tuple[int, int], bool]]:
        """Repeated (prompt, completion)s over every rollout of the groups still ok: a repeat is only
        suspicious when it is unlikely under the model, so every repeat is recomputed whether or not
        it was sampled. Returns per group its unique rollouts, this batch's keys -> first group, and
        the repeats: (group, rollout) -> whether another miner had it first."""
        unique = [0] * len(batch.groups)
        local: dict[bytes, int] = {}
        repeats: dict[tuple[int, int], bool] = {}
        for gi, g in enumerate(batch.groups):
            if reasons[gi] != R.OK:
                continue
            for ri, r in enumerate(g.rollouts):
                key = SeenIndex.key(g.prompt_ids, r.completion_ids)
                prev, first = self.seen.get(key), local.get(key)
                if prev is None and (first is None or first == gi):
                    unique[gi] += int(first is None)
                else:
                    repeats[(gi, ri)] = prev is not None and prev[0] != batch.miner
                local.setdefault(key, gi)
        return unique, local, repeats

    def _pick_rollouts(
        self, batch: RolloutBatch, blob_id: str, reasons: list[str], repeats: dict[tuple[int, int], bool]
    ) -> list[tuple[int, int]]:
        """The (group, rollout)s to recompute: every repeat, and of each group still ok its rollouts in
        a secret order, ``checked_per_group`` of them and more, a round over the groups at a time,
        until ``checked_tokens`` completion tokens are covered (the sampling check's power grows with
        the tokens it sees: short completions need every rollout, long ones a few); none once a
        cheap check found a lie."""
        if any(r in HARD_FAILURES for r in reasons):
            return []
        cfg = self.config
        live = [gi for gi in range(len(batch.groups)) if reasons[gi] == R.OK]
        orders = {gi: self._order(blob_id, gi, len(batch.groups[gi].rollouts)) for gi in live}
        take = {gi: min(len(orders[gi]), cfg.checked_per_group or len(orders[gi])) for gi in live}
        tokens = sum(
            len(batch.groups[gi].rollouts[int(ri)].completion_ids)
            for gi in live
            for ri in orders[gi][: take[gi]]
        )
        while tokens < cfg.checked_tokens and any(take[gi] < len(orders[gi]) for gi in live):
            for gi in live:
                if take[gi] < len(orders[gi]):
                    tokens += len(batch.groups[gi].rollouts[int(orders[gi][take[gi]])].completion_ids)
                    take[gi] += 1
        todo = []
        for gi in live:
            picked = {int(ri) for ri in orders[gi][: take[gi]]}
            n = len(batch.groups[gi].rollouts)
            todo += [(gi, ri) for ri in range(n) if ri in picked or (gi, ri) in repeats]
        return todo

    def _check_rollouts(
        self,
        batch: RolloutBatch,
        model: Any,
        blob_id: str,
        todo: list[tuple[int, int]],
        repeats: dict[tuple[int, int], bool],
        reasons: list[str],
        stats: CheckStats,
    ) -> tuple[
        dict[int, tuple[float, float]],
        tuple[float, int],
        list[np.ndarray],
        list[np.ndarray],
        list[Off],
    ]:
        """Recompute the picked rollouts with the model and check each: fingerprint, behaviour
        logprobs, the likelihood of its tokens, and (for a repeat) whether it is a copy. Stops at the
        first hard failure (proof enough). Returns per group the fingerprint's (squared error, count),
        the batch's (sum of log tail probabilities, count), the per-position fingerprint errors, the
        sampling distances over what was recomputed and its positions whose token is not this
        validator's pick (``Off``)."""
        fp: dict[int, tuple[float, float]] = {}
        off: list[Off] = []
        log_tails, n_tails = 0.0, 0
        pos_errs: list[np.ndarray] = []
        dists: list[np.ndarray] = []
        for (gi, ri), res in zip(todo, self._model_checks(batch, model, todo, blob_id), strict=False):
            res = self._better_opinion(res, repeats.get((gi, ri)))
            stats.add_rollout(res)
            sq, cnt = fp.get(gi, (0.0, 0.0))
            fp[gi] = (sq + res["fp_sq"], cnt + res["fp_n"])
            log_tails += res["log_tail_sum"]
            n_tails += int(res["n_tails"])
            pos_errs.append(res["fp_pos"])
            if res["samp_dist"] is not None:
                dists.append(res["samp_dist"])
                d = res["samp_dist"]
                off += [Off(gi, ri, int(t), float(d[t])) for t in off_positions(d)]
            if reasons[gi] in HARD_FAILURES:
                continue
            # a group dropped softly is still judged for proof: a soft reason must not cover a hard one
            reason = self._rollout_reason(res, repeats.get((gi, ri)))
            stats.logprob_tail_rollouts += int(reason == R.OK and res["lp_max"] > self.config.logprob_tol_max)
            if reason in HARD_FAILURES:
                reasons[gi] = reason
                break
            if reasons[gi] == R.OK:
                reasons[gi] = reason
        return fp, (log_tails, n_tails), pos_errs, dists, off

    def _rollout_reason(self, res: dict[str, Any], copied_from_other: bool | None) -> str:
        """One recomputed rollout's reason; ``copied_from_other`` is None unless it is a repeat.

        Two reasons turn on whether the rollout follows its own public uniforms (``_follows``): an
        unlikely rollout that does is bad luck (``distribution``, soft: the honest miner loses the
        group once per 1/alpha rollouts), one that does not was chosen (``sampling``, hard: a miner
        must not drop the groups it likes at will); and an unlikely repeat that does was drawn by
        this miner, so whoever holds it first copied it (a copy is never charged to the miner whose
        uniforms produced it: a copier judged first would otherwise make the victim's batch fail)."""
        cfg = self.config
        if res["fp_rollout"] > cfg.fingerprint_tol_rollout:
            return R.FINGERPRINT
        if res["lp_mean"] > cfg.logprob_tol_mean or res["lp_max"] > cfg.logprob_fail_at:
            return R.LOGPROB
        if res["dist_logp"] < math.log(cfg.distribution_alpha):
            # an honest rollout is this unlikely once per 1/alpha and misses independently of that
            return R.DISTRIBUTION if self._follows(res, math.log(cfg.distribution_alpha)) else R.SAMPLING
        repeat = copied_from_other is not None and res["seq_logprob"] < math.log(cfg.copy_max_prob)
        if repeat and not self._follows(res):
            return R.COPIED if copied_from_other else R.DUPLICATE
        return R.OK

    def _follows(self, res: dict[str, Any], log_prior: float = 0.0) -> bool:
        """Whether one rollout's tokens follow their public uniforms: no more misses (beyond
        ``sampling_margin``) than ``sampling_miss_rate`` gives at ``sampling_alpha``, where the
        rollout was already singled out by an event of honest log-probability ``log_prior``."""
        d = res.get("samp_dist")
        cfg = self.config
        if d is None or not len(d) or cfg.sampling_alpha <= 0:  # nothing to judge, or the check off
            return True
        misses = int(np.count_nonzero(d > cfg.sampling_margin))
        return binom_log_sf(misses, len(d), cfg.sampling_miss_rate) + log_prior >= math.log(
            cfg.sampling_alpha
        )

    def _check_batch_distribution(
        self, tails: tuple[float, int], reasons: list[str], stats: CheckStats
    ) -> None:
        """The chosen tokens of the whole batch: one unlikely rollout is chance, a batch of them is
        proof of another sampler, which fails the groups flagged (or, if none, every group ok)."""
        stats.distribution_batch_logp = fisher_log_pvalue_sum(*tails)
        if stats.distribution_batch_logp < math.log(self.config.distribution_batch_alpha):
            flagged = [gi for gi, r in enumerate(reasons) if r == R.DISTRIBUTION] or [
                gi for gi, r in enumerate(reasons) if r == R.OK
            ]
            for gi in flagged:
                reasons[gi] = R.DISTRIBUTION_BATCH

    @staticmethod
    def _group_fingerprints(fp: dict[int, tuple[float, float]], stats: CheckStats) -> None:
        """Each group's fingerprint error, rms over all its checked positions (reported only)."""
        errs = [math.sqrt(sq / cnt) if cnt else 0.0 for sq, cnt in fp.values()]
        if errs:
            stats.fingerprint_err_group_max = max(errs)
            stats.fingerprint_err_group_min = min(errs)

    def _check_batch_fingerprint(
        self, pos_errs: list[np.ndarray], reasons: list[str], stats: CheckStats
    ) -> None:
        """The batch's per-position fingerprint errors at ``fingerprint_quantile``: a model other
        than the version's moves every position, honest numerics only a rare one. Over the tolerance,
        every group still ok fails (the batch came from other weights)."""
        errs = np.concatenate(pos_errs) if pos_errs else np.zeros(0)
        if not errs.size or _failed_hard(reasons):  # the model work stopped at a lie: judged already
            return
        stats.fingerprint_err_quantile = float(np.quantile(errs, self.config.fingerprint_quantile))
        if stats.fingerprint_err_quantile > self.config.fingerprint_tol:
            for gi, r in enumerate(reasons):
                if r == R.OK:
                    reasons[gi] = R.FINGERPRINT

    def _check_batch_sampling(self, dists: list[np.ndarray], reasons: list[str], stats: CheckStats) -> None:
        """Whether the batch's tokens follow their public uniforms: more misses than honest numerics
        make (a binomial bound at ``sampling_miss_rate``), or more uniforms outside their intervals
        on any rung inside the margin than its honest rate gives (``rung_log_sf``), fail every group
        still ok."""
        d = np.concatenate(dists) if dists else np.zeros(0)
        cfg = self.config
        stats.sampling_tokens = int(d.size)
        stats.sampling_misses = int(np.count_nonzero(d > cfg.sampling_margin))
        stats.sampling_dist_max = float(d.max()) if d.size else 0.0
        stats.sampling_dists = d
        stats.sampling_rung_logp = rung_log_sf(d, cfg)
        if cfg.sampling_alpha <= 0 or _failed_hard(reasons):  # off (calibration), or judged already
            return
        log_alpha = math.log(cfg.sampling_alpha)
        if (
            binom_log_sf(stats.sampling_misses, stats.sampling_tokens, cfg.sampling_miss_rate) < log_alpha
            or stats.sampling_rung_logp < log_alpha - math.log(max(1, len(cfg.sampling_rungs)))
        ):
            for gi, r in enumerate(reasons):
                if r == R.OK:
                    reasons[gi] = R.SAMPLING

    def _check_sides(
        self,
        batch: RolloutBatch,
        model: Any,
        blob_id: str,
        off: list[Off],
        problems: list[Any],
        reasons: list[str],
        stats: CheckStats,
    ) -> None:
        """Whether the sides the miner took where its tokens are not this validator's picks pay more
        often than even odds allow (``proof.sides``): up to ``side_checks`` such positions of groups
        still ok are judged and folded into the key's record — the misses first (beyond the margin:
        honest rounding makes one seldom, so judging them costs an honest batch nothing however dense
        its drift), then those beyond honest reach, then, while the positions off are not dense, the
        rest (``pick_sides``). A record past ``sampling_alpha`` fails every group still ok as
        ``sampling``."""
        cfg = self.config
        if cfg.side_checks <= 0 or cfg.sampling_alpha <= 0 or _failed_hard(reasons):
            return
        off = [o for o in off if reasons[o.group] == R.OK]
        stats.side_positions = len(off)
        picked = self.pick_sides(blob_id, off, stats.sampling_tokens)
        if not picked:
            return
        gen = cfg.generation
        sides = []
        for gi, ri, t, _ in sorted(picked):
            g, r = batch.groups[gi], batch.groups[gi].rollouts[ri]
            u = uniforms(sample_key(batch.prompt_seed, batch.miner, g.index, ri), gen.max_new_tokens)
            ids = r.completion_ids.tolist()
            sides.append(Side(g.prompt_ids.tolist(), ids[:t], u[t:], problems[gi], float(r.reward)))
        signs = judge_sides(model, self.tokenizer, self.task, sides, gen.max_new_tokens, gen.temperature, gen.top_p)
        stats.side_judged = len(signs)
        stats.side_won, stats.side_lost = signs.count(1), signs.count(-1)
        if not stats.side_won and not stats.side_lost:
            stats.side_logp = self.sides.log_sf(batch.miner)
            return
        stats.side_logp = self.sides.add(batch.miner, stats.side_won, stats.side_lost)
        if stats.side_logp < math.log(cfg.sampling_alpha):
            for gi, r in enumerate(reasons):
                if r == R.OK:
                    reasons[gi] = R.SAMPLING

    def pick_sides(self, blob_id: str, off: list[Off], tokens: int) -> list[Off]:
        """Which of the positions ``off`` (of ``tokens`` checked) to judge, up to ``side_checks`` in
        all: the misses (beyond the margin) first, picked from the secret; then those beyond honest
        reach (past ``side_reach`` of the margin), the farthest first; then, while all of ``off`` are
        at most ``side_dense`` of the tokens (or ``side_checks``), the rest, picked from the secret.
        Each tier depends on the distances alone, never on what a side earns, so an honest key's
        decided sides stay at even odds whichever are judged."""
        cfg = self.config
        reach = cfg.sampling_margin * cfg.side_reach
        far = [o for o in off if o.distance > cfg.sampling_margin]
        wide = [o for o in off if reach < o.distance <= cfg.sampling_margin]
        near = [o for o in off if o.distance <= reach]
        picked = [far[int(i)] for i in self._secret_pick(b"far", blob_id, (), len(far), cfg.side_checks)]
        room = cfg.side_checks - len(picked)
        if wide and room > 0:
            rank = self._secret_rng(b"wide", blob_id, ()).permutation(len(wide))
            order = sorted(range(len(wide)), key=lambda i: (-wide[i].distance, rank[i]))
            picked += [wide[i] for i in order[:room]]
            room = cfg.side_checks - len(picked)
        if near and room > 0 and len(off) <= max(cfg.side_checks, cfg.side_dense * tokens):
            picked += [near[int(i)] for i in self._secret_pick(b"sides", blob_id, (), len(near), room)]
        return sorted(picked)

    def _remember(
        self, batch: RolloutBatch, verdict: BatchVerdict, keys: dict[bytes, int], blob_id: str
    ) -> None:
        """Only accepted content claims a place in the seen index, and each accepted group its slot."""
        for key, gi in keys.items():
            if verdict.groups[gi].accepted:
                self.seen.add(key, batch.miner, blob_id)
        for g, gv in zip(batch.groups, verdict.groups, strict=True):
            if gv.accepted:
                self.used_slots[(batch.prompt_seed, batch.miner, g.index)] = None
        return verdict

    def _verdict(
        self,
        batch: RolloutBatch,
        reasons: list[str],
        problems: list[Any],
        unique: list[int],
        stats: CheckStats,
    ) -> BatchVerdict:
        hard = any(r in HARD_FAILURES for r in reasons)
        if hard:  # a batch that lies anywhere earns nothing anywhere
            reasons = [r if r != R.OK else R.NOT_CHECKED for r in reasons]
        groups, valid, n_unique = [], [], 0
        for gi, reason in enumerate(reasons):
            ok = reason == R.OK
            groups.append(GroupVerdict(gi, ok, reason))
            if ok:
                n_unique += unique[gi]
                valid.append(rollout_group(batch, gi, problems[gi]))
        return BatchVerdict(groups, valid, hard, n_unique, stats)

    # -- the forward pass ------------------------------------------------------------------------
    def _secret_pick(self, prefix: bytes, blob_id: str, ids: tuple[int, ...], n: int, k: int) -> np.ndarray:
        """``k`` of ``range(n)`` (all when ``k`` is 0 or ≥ n), drawn from SHA-256(prefix ‖ our secret ‖
        blob id ‖ ids): fixed by the blob the miner committed to, unknowable to it."""
        if k <= 0 or k >= n:
            return np.arange(n)
        return self._secret_rng(prefix, blob_id, ids).choice(n, size=k, replace=False)

    def _secret_rng(self, prefix: bytes, blob_id: str, ids: tuple[int, ...]) -> np.random.Generator:
        data = (
            prefix
            + self.position_secret
            + bytes.fromhex(blob_id)
            + b"".join(i.to_bytes(4, "big") for i in ids)
        )
        return np.random.default_rng(int.from_bytes(hashlib.sha256(data).digest()[:8], "big"))

    def _positions(self, blob_id: str, gi: int, ri: int, n: int) -> np.ndarray:
        """Completion positions of one rollout whose sketches are compared."""
        return np.sort(self._secret_pick(b"", blob_id, (gi, ri), n, self.config.positions_per_rollout))

    def _order(self, blob_id: str, gi: int, n: int) -> np.ndarray:
        """Group ``gi``'s rollouts in the secret order they are picked for recomputation, unknown to
        the miner at commit time."""
        return self._secret_rng(b"sample", blob_id, (gi,)).permutation(n)

    def _sampled(self, blob_id: str, gi: int, n: int) -> set[int]:
        """The ``checked_per_group`` rollouts of group ``gi`` recomputed first (all when 0)."""
        k = self.config.checked_per_group
        return {int(i) for i in self._order(blob_id, gi, n)[: k if k > 0 else n]}

    def _model_checks(
        self, batch: RolloutBatch, model: Any, todo: list[tuple[int, int]], blob_id: str
    ) -> Iterator[dict[str, float]]:
        """Per job of ``todo``, in order, lazily: each forward runs only when its results are wanted."""
        cfg = self.config
        jobs = []
        for gi, ri in todo:
            g, r = batch.groups[gi], batch.groups[gi].rollouts[ri]
            pos = self._positions(blob_id, gi, ri, len(r.completion_ids))
            u = uniforms(sample_key(batch.prompt_seed, batch.miner, g.index, ri), len(r.completion_ids))
            jobs.append(Job(g.prompt_ids, r.completion_ids, r.logprobs, r.sketches, pos, u))
        gen = cfg.generation
        low = _low_precision(model)
        return iter_rollout_stats(
            model,
            jobs,
            batch.manifest_hash,
            batch.sketch_dim,
            gen.temperature,
            gen.top_p,
            cfg.forward_tokens,
            recheck=self._looks_off if low else None,
            top_p_slack=cfg.sampling_margin,  # the sampling check's allowance, at the top-p cut too
            float32=cfg.forward_float32 and low,
        )

    def _better_opinion(self, res: dict[str, Any], copied_from_other: bool | None) -> dict[str, Any]:
        """A rollout computed again in float32 (``_looks_off``) is judged by the reference it matches
        better: the float32 one only if its reason is milder (ok, then soft, then hard), else the
        model precision's (rounding alone moves an honest token of the built-in model, exact in bf16,
        past its tight float32 margin). ``float32_rechecked`` counts the second opinions."""
        alt = res.pop("float32", None)
        if alt is None:
            return res
        mine, other = (
            self._rollout_reason(res, copied_from_other),
            self._rollout_reason(alt, copied_from_other),
        )
        chosen = alt if _severity(other) < _severity(mine) else res
        return {**chosen, "float32_rechecked": 1.0}

    def _looks_off(self, res: dict[str, Any]) -> bool:
        """A rollout any per-rollout check would fail, or with a token beyond the sampling margin:
        judged again on the float32 reference before anything is concluded from it."""
        cfg = self.config
        d = res.get("samp_dist")
        return bool(
            res["fp_rollout"] > cfg.fingerprint_tol_rollout
            or res["lp_mean"] > cfg.logprob_tol_mean
            or res["lp_max"] > cfg.logprob_fail_at
            or res["dist_logp"] < math.log(cfg.distribution_alpha)
            or (d is not None and len(d) and float(np.max(d)) > cfg.sampling_margin)
        )


def _severity(reason: str) -> int:
    return 0 if reason == R.OK else 2 if reason in HARD_FAILURES else 1


def _low_precision(model: Any) -> bool:
    """Whether the model computes in less than float32 (bf16/fp16 weights): its full forward then
    carries rounding of its own that a float32 one does not."""
    import torch

    p = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return p is not None and p.is_floating_point() and p.dtype != torch.float32


def _failed_hard(reasons: list[str]) -> bool:
    return any(r in HARD_FAILURES for r in reasons)


def reject_all(n: int, reason: str, hard: bool = False) -> BatchVerdict:
    """Every group of an ``n``-group batch rejected for one reason (a batch judged as a whole)."""
    return BatchVerdict([GroupVerdict(i, False, reason) for i in range(n)], [], hard)


def to_verdict(bv: BatchVerdict, announcement: RolloutAnnouncement, miner_key: bytes) -> Verdict:
    """The signed-ready Verdict body for gossip."""
    return Verdict(
        blob_id=announcement.blob.id,
        miner=miner_key.hex(),
        version=announcement.version,
        groups=tuple(bv.groups),
    )
