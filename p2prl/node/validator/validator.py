"""The validator: sync weights, check announced rollout batches, publish signed verdicts and scores.

Its ModelHost (``p2prl.node.weights.host``) keeps the last few versions reachable (``keep_states``)
so a batch made one or two versions ago is checked against the model that made it, loaded into its
one model object on demand.
Announcements wait in a per-signer fair queue (``judgequeue.JudgeQueue``: quotas, standing
classes, a negative cache, (signer, blob) judged once per staleness window) until the validator holds
their version; anything older than the staleness bound or never reachable is answered with a soft
reject, not silence. A blob is first given a short fetch (the availability probe); only one that
started to arrive gets the full fetch time.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING

from p2prl.crypto import Identity
from p2prl.lru import LRU
from p2prl.node.runtime.pump import Handlers
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.runtime.task import generation_params, task_of
from p2prl.node.setup.settings import ValidatorSettings
from p2prl.node.validator.judgequeue import GOOD, NEW, Announcement, JudgeQueue, key_of
from p2prl.node.validator.receiptlists import RECEIPTS_FILE, ReceiptLists
from p2prl.node.validator.scorefile import (
    SCORES_FILE,
    SIDES_FILE,
    load_scores,
    load_sides,
    save_scores,
    save_sides,
)
from p2prl.node.weights.engine import VLLMMinerEngine, open_reference_vllm
from p2prl.node.weights.isa import IsaEngine
from p2prl.node.weights.start import open_synced_role
from p2prl.node.weights.sync import WeightSync
from p2prl.node.weights.version import Weights
from p2prl.proof import (
    RolloutValidator,
    ScoreBook,
    ValidatorConfig,
    calibrate_tolerances,
    reject_all,
    to_verdict,
)
from p2prl.protocol import PatchManifest, Receipts, RolloutAnnouncement
from p2prl.reasons import NodeDrop, VerdictReason

log = logging.getLogger(__name__)

SCORES_EVERY_S = 5.0
ROLLOUT_PROBE_S = 3.0  # a blob none of whose bytes arrive this fast is not served: soft reject, strike
ROLLOUT_FETCH_S = 20.0  # a batch its miner cannot serve soon is not worth blocking the checks for
RETRY_BACKOFF_S = (1.0, 3.0, 6.0)  # pauses before asking again for a miner in standing's batch
RETRY_NEW_BELOW = 16  # a new key's batch is retried only while fewer announcements than this wait
FETCHERS = 3  # blobs fetched in parallel, off the judging thread; fetcher 0 serves good standing only
READY_MAX = 4  # fetched blobs waiting to be judged
BEHIND_S = 30.0  # an announcement queued this long: judging is behind, and status says so
# Judging waits this long at most for calibration's first tolerances (about 2 s on the default
# model): a dishonest demo miner's first batch, judged with the genesis's loose ones meanwhile on an
# AVX2 machine, was accepted. A calibration slower than this (a loaded machine, a real model) is
# judged through with the genesis's tolerances as before, so batches do not go stale waiting.
FIRST_TOLERANCES_WAIT_S = 10.0
# the tolerances are measured again as the model trains: once it moved this many versions past the last
# calibration, no sooner than RECALIBRATE_MIN_S after it and at most RECALIBRATE_SHARE of the time
RECALIBRATE_VERSIONS = 32
RECALIBRATE_MIN_S = 300.0
RECALIBRATE_SHARE = 0.1
# a batch of a miner in standing that does not continue its last judged one waits this long for the
# batch before it (gossip may deliver a miner's announcements out of order) before it is index_gap
REORDER_HOLD_S = 5.0
HOLD_PER_SIGNER = 2  # batches held per signer, each with its bytes
HOLD_MAX = 32  # batches held in all
# a batch announced in time is judged though this validator fell behind, up to this many versions past
# the staleness window (their weights stay reachable): the lag is this validator's, not the miner's
LATE_VERSIONS = 4
ARRIVALS_MAX = 8192  # (signer, blob) -> this validator's version when the announcement was made
# a signed creation time up to this long before arrival is believed (gossip held the announcement back,
# or the clocks differ); an earlier claim counts as this long before arrival
GOSSIP_DELAY_S = 20.0
POSITION_TAG = b"p2prl/validator/position-secret/v1"


if TYPE_CHECKING:
    import torch

    from p2prl.proof import BatchVerdict
    from p2prl.rl import GenerationParams, RolloutEngine, Task, Tokenizer


class Fetch(Enum):
    """``check(item)``'s default: fetch the blob there (None would mean: nobody could serve it)."""

    HERE = "here"
    STALE = "stale"  # its version left the staleness window while queued: answered without a fetch
    SHED = "shed"  # over its signer's quota: not judged, its announced indices passed over


def _worth_a_wait(bv: BatchVerdict) -> bool:
    """Every group rejected ``index_gap`` (the batch does not continue its miner's last judged one) or
    ``unknown_receipts`` (the trainer's list that seeds it has not arrived here yet): worth a wait."""
    reasons = {g.reason for g in bv.groups}
    return reasons == {VerdictReason.INDEX_GAP} or reasons == {VerdictReason.UNKNOWN_RECEIPTS}


def position_secret(identity: Identity) -> bytes:
    """The secret that picks checked positions: the validator's signature over a fixed tag.

    Ed25519 signatures are deterministic, so it is the same after a restart (a miner cannot wait
    for new positions by forcing one), and nobody without the validator's key can compute it.
    """
    return bytes(identity.sign(POSITION_TAG))


PROOF_TOLERANCES = ("fingerprint_tol", "fingerprint_tol_rollout", "logprob_tol_mean", "logprob_tol_max")
PROOF_ERRORS = ("fingerprint_err_max", "fingerprint_err_group_max", "logprob_err_max")


def calibrated(
    model: torch.nn.Module,
    tok: Tokenizer,
    task: Task,
    gen: GenerationParams,
    manifest_hash: str,
    vcfg: ValidatorConfig,
    early: Callable[[ValidatorConfig], None] | None = None,
    reference: Callable[[int], RolloutEngine] | None = None,
    floor: ValidatorConfig | None = None,
) -> ValidatorConfig:
    """``vcfg`` with tolerances from this engine's own honest drift (KV-cache generation at two batch
    sizes against the full forward), so a miner on the same engine with other or perturbed weights
    fails where the loose defaults would let a small perturbation through. ``early``: the first
    batches' tolerances, while more are mined on an engine that is not exact. ``reference``: the
    engine the network's miners also run (vLLM, or an AVX2 CPU's kernels), given the batch size:
    reference batches are mined with both, and the tolerances hold the loosest pair. ``floor``: the
    genesis's pinned tolerances (the founder's reference run over the miners' engines), which no
    calibrated one goes below."""
    t0 = time.monotonic()
    others = () if reference is None else (reference,)
    if floor is not None and early is not None:
        first = early

        def early(c: ValidatorConfig) -> None:
            first(c.at_least(floor))

    cfg, drift = calibrate_tolerances(model, tok, task, gen, manifest_hash, vcfg, early=early, other_engines=others)
    if floor is not None:
        cfg = cfg.at_least(floor)
    log.info(
        "tolerances calibrated in %.1f s: fingerprint %.4f (rollout %.4f), logprob %.4f / %.4f; drift %s",
        time.monotonic() - t0,
        cfg.fingerprint_tol,
        cfg.fingerprint_tol_rollout,
        cfg.logprob_tol_mean,
        cfg.logprob_tol_max,
        {k: round(v, 5) for k, v in drift.items()},
    )
    return cfg


class Validator:
    def __init__(self, env: RoleEnv[ValidatorSettings]) -> None:
        self.env = env
        keep = max(env.settings.keep_states, int(env.g.max_staleness) + 1 + LATE_VERSIONS)
        role = open_synced_role(env, "validator", keep)
        self.dir, self.book, self.host, tok = role.dir, role.book, role.host, role.tok
        self.engine = self.host.engine
        start = self.host.current
        self.sync = WeightSync(env, self.book, self.host, consecutive=True)
        gen = generation_params(env)
        vcfg = ValidatorConfig.from_genesis(
            env.g,
            checked_per_group=env.settings.checked_per_group,
            forward_float32=env.settings.forward_float32,
        )
        # the genesis's pinned tolerances, which no calibration here goes below (None: none pinned)
        self._floor = vcfg if env.g.proof is not None else None
        task = task_of(env)  # built once: a data-backed task reads and hashes its file
        self._tuned: ValidatorConfig | None = None  # calibrated tolerances, applied between two checks
        self._calibration_started = 0.0
        self.calibration: threading.Thread | None = None
        # what calibration needs (tokenizer, task, generation, the genesis's rules); None: never again
        self._cal_args: tuple[Tokenizer, Task, GenerationParams, ValidatorConfig] | None = None
        # (version, monotonic time done, seconds it took) of the last calibration; None while one runs
        self._cal_mark: tuple[int, float, float] | None = None
        if env.settings.calibrate_tolerances:
            self.calibration = self._start_calibration(tok, task, gen, start, vcfg)
        self.receipts = ReceiptLists(path=self.dir / RECEIPTS_FILE)  # kept across restarts
        self.checker = RolloutValidator(
            self.host.source,
            tok,
            task,
            vcfg,
            position_secret=position_secret(env.identity),
            receipts=self.receipts.entries,
        )
        load_sides(self.dir / SIDES_FILE, self.checker.sides)  # a restart keeps a steering key's record
        self.max_staleness = int(env.g.max_staleness)
        self.jq = JudgeQueue(self.max_staleness + LATE_VERSIONS)  # judged pairs kept while judgeable
        self.jq_cond = threading.Condition()
        self.in_flight: set[str] = set()  # signers with a batch being fetched or judged (one each)
        self._arrived: LRU[tuple[str, str], int] = LRU(ARRIVALS_MAX)  # the pump's: version when made
        # (wall time, version) of each version this validator switched to: what it held when
        self._timeline: deque[tuple[float, int]] = deque([(time.time(), self.current.version)], maxlen=4096)
        # the judging thread's: batches read but not continuing their miner's indices, waiting for
        # the batch before them (signer -> [(deadline, item, bytes, t0)], oldest signed first)
        self._held: dict[str, list[tuple[float, Announcement, bytes, float]]] = {}
        # the judging thread's; kept across restarts (a restart must not zero honest scores, nor clear a hard failure)
        self.scores = load_scores(self.dir / SCORES_FILE, ScoreBook(env.settings.score_window))
        self.ready: queue.Queue[tuple[Announcement, bytes | Fetch | None]] = queue.Queue(READY_MAX)
        self._last_scores = 0.0
        self._behind = False
        for k in PROOF_TOLERANCES:  # beside the largest errors seen (_record): how close honest miners come
            env.status.gauge(f"proof_{k}", getattr(vcfg, k))
        self._apply_calibration()  # a model calibrated here, before judging

    def _start_calibration(
        self, tok: Tokenizer, task: Task, gen: GenerationParams, start: Weights, vcfg: ValidatorConfig
    ) -> threading.Thread | None:
        """Calibrate on a copy of the start model in a thread of its own: minutes on a real model,
        during which announced batches are judged with the genesis's tolerances instead of expiring
        unjudged (status ``calibrating``). A model that cannot be copied is calibrated here."""
        seed_hash = start.hash if start.verified else ""  # unverified: any seed calibrates
        self._cal_args = (tok, task, gen, vcfg)
        try:
            model = copy.deepcopy(self.engine.model)
        except Exception as e:  # any model: the copy is an optimisation
            log.warning("model not copyable (%s): calibrating before judging", e)
            self._cal_args = None  # nor measured again as it trains
            self._tuned = calibrated(self.engine.model, tok, task, gen, seed_hash, vcfg, floor=self._floor)
            return None
        self.env.status.set(calibrating=True)
        self._calibration_started = time.monotonic()
        log.info("calibrating tolerances in the background; judging with the genesis's tolerances until done")
        return self._calibrate_in_background(model, seed_hash, start.version, self._tune_early)

    def _calibrate_in_background(
        self,
        model: torch.nn.Module,
        seed_hash: str,
        version: int,
        early: Callable[[ValidatorConfig], None] | None,
    ) -> threading.Thread:
        """Tolerances measured on ``model`` (version ``version``) in a thread of its own; judged with
        from the next check once done (and ``early``'s first ones meanwhile)."""
        assert self._cal_args is not None
        tok, task, gen, vcfg = self._cal_args

        def run() -> None:
            reference: VLLMMinerEngine | IsaEngine | None = None
            mine: Callable[[int], RolloutEngine] | None = None
            t0 = time.monotonic()
            try:
                if self.env.settings.reference_engine == "vllm":
                    vllm = reference = open_reference_vllm(self.env, model, tok)
                    mine = lambda _bs: vllm  # noqa: E731  (vLLM batches by itself)
                    log.info("calibrating against reference batches mined with vLLM")
                elif self.env.settings.reference_engine == "hf-avx2":
                    older = reference = IsaEngine("avx2", model, tok)
                    mine = older.sized
                    log.info("calibrating against reference batches mined with %s kernels", older.capability)
                self._tuned = calibrated(
                    model, tok, task, gen, seed_hash, vcfg, early=early, reference=mine, floor=self._floor
                )
                self.env.status.gauge("calibrated_version", version)
            except Exception:
                log.exception("calibration failed: judging with the tolerances held")
                self.env.status.set(calibrating=False)
                self.env.status.incr_label("check_failed", "calibration")
            finally:
                if reference is not None:
                    reference.close()
                self._cal_mark = (version, time.monotonic(), time.monotonic() - t0)

        t = threading.Thread(target=run, name="p2prl-calibrate", daemon=True)
        t.start()
        return t

    def _maybe_recalibrate(self) -> None:
        """Measure the tolerances again as the model trains (judging thread): once the version moved
        ``RECALIBRATE_VERSIONS`` past the last calibration and at most ``RECALIBRATE_SHARE`` of the
        time goes to calibrating. Judged with the tolerances held until the new ones are done; the
        same engine and version give another validator the same tolerances (fixed seed, fixed key)."""
        if self._cal_args is None or self._cal_mark is None or self._calibrating():
            return
        version, done, took = self._cal_mark
        cur = self.current
        if not cur.verified or cur.version < version + RECALIBRATE_VERSIONS:
            return
        if time.monotonic() - done < max(RECALIBRATE_MIN_S, took / RECALIBRATE_SHARE):
            return
        src = self.host.source(cur.version)
        if src is None:
            return
        seed_hash, model = src
        self._cal_mark = None  # one at a time
        self.env.status.incr("recalibrations")
        log.info("measuring the tolerances again at v%d (last at v%d)", cur.version, version)
        self.calibration = self._calibrate_in_background(copy.deepcopy(model), seed_hash, cur.version, None)

    def _tune_early(self, cfg: ValidatorConfig) -> None:
        """The calibration thread's first tolerances: judged with from the next check, not the
        genesis's loose ones, while calibration mines more (seconds on the default model with AVX2
        kernels: a dishonest demo miner's batch judged meanwhile was accepted)."""
        log.info("first tolerances calibrated; refining the sampling margin on more tokens")
        self._tuned = cfg

    def _apply_calibration(self) -> None:
        """Judge with the calibrated tolerances from the next check on (the judging thread only)."""
        self._maybe_recalibrate()
        tuned = self._tuned
        if tuned is None or self.checker.config is tuned:
            return
        self.checker.config = tuned
        for k in PROOF_TOLERANCES:
            self.env.status.gauge(f"proof_{k}", getattr(tuned, k))
        self.env.status.set(calibrating=False)

    def wait_calibrated(self, timeout: float | None = None) -> bool:
        """Block until the tolerances are calibrated (or calibration is off); True if done."""
        if self.calibration is not None:
            self.calibration.join(timeout)
            if self.calibration.is_alive():
                return False
        self._apply_calibration()
        return True

    @property
    def current(self) -> Weights:
        """The newest version held (the host's current one); older ones are loaded on demand."""
        return self.host.current

    # -- pump thread ----------------------------------------------------------------------
    def on_announcement(self, item: Announcement) -> None:
        with self.jq_cond:
            self._arrived.put(key_of(item), self._held_at(item.message.created_ms / 1000.0))
            evicted = self.jq.evicted
            why = self.jq.offer(item)
            evicted = self.jq.evicted - evicted
            self.jq_cond.notify()
        if why is not None:
            self.env.status.incr_label("dropped", why)
        if evicted:
            self.env.status.incr_label("dropped", NodeDrop.VALIDATOR_QUEUE_EVICTED, evicted)

    # -- work loop --------------------------------------------------------------------------
    def run(self) -> None:
        env = self.env
        while not env.stop.is_set():
            for w in self.host.switch():
                with self.jq_cond:
                    self.jq.judged.prune(w.version)
                    self._timeline.append((time.time(), w.version))
            self._release_held()  # batches whose wait for the batch before them is over
            self._maybe_publish_scores()
            self._report_backlog()
            if self._awaiting_first_tolerances():
                env.stop.wait(0.1)
                continue
            try:
                item, data = self.ready.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.check(item, data)
            except Exception:
                log.exception("checking an announcement failed")
                env.status.incr_label("check_failed", "exception")

    def fetch_loop(self, lane: int) -> None:
        """Fetch queued blobs for the judging thread: a blob nobody serves costs a fetcher a probe,
        never the judge; lane 0 serves only miners in good standing, so a flood cannot take it."""
        env = self.env
        while not env.stop.is_set():
            item = self._next(classes=1 if lane == 0 else 3)
            if item is None:
                continue
            with self.jq_cond:
                if key_of(item) in self.jq.judged:
                    env.status.incr_label("dropped", NodeDrop.DUPLICATE_ANNOUNCEMENT)
                    self.in_flight.discard(key_of(item)[0])
                    self.jq_cond.notify_all()
                    continue
            with self.jq_cond:
                shed = self.jq.take_shed(item)
            data = Fetch.SHED if shed else Fetch.STALE if self._stale(item) else self._fetch(item)
            while not env.stop.is_set():
                try:
                    self.ready.put((item, data), timeout=0.5)
                    break
                except queue.Full:
                    continue

    def _held_at(self, made: float) -> int:
        """The version this validator held when a batch was announced: at its signed creation time,
        believed back to ``GOSSIP_DELAY_S`` before now (a connection that held gossip back for
        seconds is the network's fault, not the miner's); caller holds ``jq_cond``."""
        t = min(time.time(), max(made, time.time() - GOSSIP_DELAY_S))
        for at, version in reversed(self._timeline):
            if at <= t:
                return version
        return self._timeline[0][1]

    def _as_of(self, item: Announcement) -> int:
        """The version a batch is judged as of: this validator's when the batch was announced (its
        signed time, believed back to ``GOSSIP_DELAY_S``; or the batch's own version, if it came
        before this validator held it), never past the current one. A batch announced in time is
        not ``stale`` because gossip or judging here lagged behind."""
        with self.jq_cond:
            arrived = self._arrived.get(key_of(item), self.current.version)
        return min(self.current.version, max(arrived, item.message.version))

    def _stale(self, item: Announcement) -> bool:
        """Late when it arrived, or so far behind now that its weights are out of reach (past
        ``LATE_VERSIONS``, or an anchor synced through since): ``stale`` whatever its bytes, so no
        fetch is spent on it (a backlog drains at once, not a probe each)."""
        v, cur = item.message.version, self.current.version
        return (
            self._as_of(item) - v > self.max_staleness
            or cur - v > self.max_staleness + LATE_VERSIONS
            or (v < cur and not self.host.can_load(v))
        )

    def _next(self, classes: int = 3) -> Announcement | None:
        """The next announcement to judge (fair per signer; one whose version we hold or never will)."""
        with self.jq_cond:
            item = self.jq.next(self.current.version, classes=classes, skip=self.in_flight)
            if item is None:
                self.jq_cond.wait(0.5)
            else:
                self.in_flight.add(key_of(item)[0])
            return item

    def _done(self, item: Announcement) -> None:
        """The signer's batch is judged: its next one may be fetched (one at a time, in order)."""
        with self.jq_cond:
            self.in_flight.discard(key_of(item)[0])
            self.jq_cond.notify_all()

    def check(self, item: Announcement, data: bytes | Fetch | None = Fetch.HERE) -> BatchVerdict | None:
        """Judge ``item`` (see ``_check``), then let its signer's next batch be fetched, and judge
        again what of that signer waited for the batch before it."""
        try:
            bv = self._check(item, data)
        finally:
            self._done(item)
        signer = item.envelope.signer_hex
        if not any(h[1] is item for h in self._held.get(signer, ())):  # judged, shed or a repeat
            self._release_held(signer)
        return bv

    def _check(self, item: Announcement, data: bytes | Fetch | None = Fetch.HERE) -> BatchVerdict | None:
        """Fetch the batch, judge it, publish the verdict; returns the BatchVerdict (None: a repeat,
        or held for the miner's batch before it).

        A (signer, blob) is judged once in the staleness window: the checker records each prompt
        index it has seen, so judging the same blob again (a re-gossiped or replayed announcement)
        would fail it as ``duplicate_index`` and zero an honest miner. Another key announcing the
        same blob id is judged on its own (and fails: the batch names its real miner).
        """
        env = self.env
        ann = item.message
        miner = item.envelope.signer
        self._apply_calibration()
        with self.jq_cond:
            if key_of(item) in self.jq.judged:
                env.status.incr_label("dropped", NodeDrop.DUPLICATE_ANNOUNCEMENT)
                return None
        t0 = time.monotonic()
        if data is Fetch.HERE:
            with self.jq_cond:
                data = Fetch.SHED if self.jq.take_shed(item) else data
        if data is Fetch.SHED:  # shed under load: no verdict, and no gap in the miner's indices
            self.checker.pass_over(ann, miner)
            return None
        if data is Fetch.STALE or (data is not None and self._stale(item)):
            bv = reject_all(ann.groups, VerdictReason.STALE)
            self._publish(item, bv, t0, judged=False)
            return bv
        if data is Fetch.HERE:
            data = self._fetch(item)
        if data is None:  # this validator's observation, not proof of the miner's fault
            with self.jq_cond:
                self.jq.unfetchable(item)  # a strike: repeated, it lowers the miner's standing
            self.checker.pass_over(ann, miner)  # its next batch is judged on its own
            bv = reject_all(ann.groups, VerdictReason.UNREACHABLE)
        else:
            with self.jq_cond:
                self.jq.judged.add(key_of(item), ann.version)
            bv = self.checker.check(ann, miner, data, self._as_of(item))
            if self._hold(item, data, bv, t0):
                return None
            self._judged(item, bv)
        self._publish(item, bv, t0, judged=data is not None)
        return bv

    def _judged(self, item: Announcement, bv: BatchVerdict) -> None:
        """A batch read and judged: its signer's standing follows the verdict."""
        with self.jq_cond:
            self.jq.judged_ok(item, bool(bv.valid_groups), bool(bv.hard_failure))
        if bv.valid_groups and not bv.hard_failure:
            self.env.net.grant_standing(item.envelope.signer)  # its gossip is no longer an unproven key's

    def _publish(self, item: Announcement, bv: BatchVerdict, t0: float, judged: bool) -> None:
        ann, miner = item.message, item.envelope.signer
        verdict = replace(to_verdict(bv, ann, miner), announcement=item.envelope.digest.hex())
        self.env.publish("verdicts", verdict)
        self._record(ann, miner, bv, time.monotonic() - t0, judged=judged)

    # -- batches that arrived before the batch they follow -----------------------------------
    def _hold(self, item: Announcement, data: bytes, bv: BatchVerdict, t0: float) -> bool:
        """Keep a batch of a miner in standing that does not continue its last judged batch
        (``index_gap``), or whose trainer's receipts list has not arrived here (``unknown_receipts``),
        for ``REORDER_HOLD_S``, bounded per signer and in all: gossip can bring a miner's second
        announcement before its first, or a chained batch before the list it follows, and judging it at
        once would cost the miner the batch. A skipped batch stays a gap."""
        signer = item.envelope.signer_hex
        waiting = self._held.get(signer, [])
        if not _worth_a_wait(bv) or any(h[1] is item for h in waiting):
            return False
        with self.jq_cond:
            standing = self.jq.standing(signer)
        if standing != GOOD or len(waiting) >= HOLD_PER_SIGNER or self._n_held() >= HOLD_MAX:
            return False
        waiting.append((time.monotonic() + REORDER_HOLD_S, item, data, t0))
        waiting.sort(key=lambda h: (h[1].message.version, h[1].message.created_ms))
        self._held[signer] = waiting
        self.env.status.incr("batches_held")
        return True

    def _n_held(self) -> int:
        return sum(len(w) for w in self._held.values())

    def _release_held(self, signer: str | None = None) -> list[BatchVerdict]:
        """Judge again the held batches of ``signer`` (a batch of it was just judged: they may continue
        it now), or with None those of any signer whose wait is over; the verdicts published."""
        now = time.monotonic()
        out: list[BatchVerdict] = []
        for s in [signer] if signer is not None else list(self._held):
            waiting = self._held.pop(s, [])
            if signer is None and all(h[0] > now for h in waiting):
                if waiting:
                    self._held[s] = waiting
                continue
            keep = []
            for deadline, item, data, t0 in waiting:
                if self._stale(item):  # its weights went out of reach while it waited
                    bv = reject_all(item.message.groups, VerdictReason.STALE)
                    self._publish(item, bv, t0, judged=False)
                    out.append(bv)
                    continue
                bv = self.checker.check(item.message, item.envelope.signer, data, self._as_of(item))
                if deadline > now and _worth_a_wait(bv):
                    keep.append((deadline, item, data, t0))
                    continue
                self._judged(item, bv)
                self._publish(item, bv, t0, judged=True)
                out.append(bv)
            if keep:
                self._held[s] = keep
        return out

    def _fetch(self, item: Announcement) -> bytes | None:
        """The blob's bytes, or None. A miner in good standing is asked again after each failed try
        (``RETRY_BACKOFF_S``: every provider the network knows, each time), so a blob server that
        pauses for seconds costs no batch; so is a new key while fewer than ``RETRY_NEW_BELOW``
        announcements wait (an honest miner's first batch on a busy machine); under a flood an
        unproven key gets one try, so blobs nobody serves cost a probe each, and a penalized key
        always one."""
        with self.jq_cond:
            standing, queued = self.jq.standing(item.envelope.signer_hex), len(self.jq)
        # a new key (an honest miner's first batch) is asked again too while nothing floods the queue
        retry = standing == GOOD or (standing == NEW and queued < RETRY_NEW_BELOW)
        pauses = RETRY_BACKOFF_S if retry else ()
        data = self._fetch_once(item)
        for pause in pauses:
            if data is not None or self.env.stop.wait(pause):
                break
            self.env.status.incr_label("rollout_fetch_retries", "standing")
            data = self._fetch_once(item)
        return data

    def _fetch_once(self, item: Announcement) -> bytes | None:
        """The blob's bytes, or None: a short probe first, the full fetch only if bytes arrived."""
        env, ann = self.env, item.message
        origin = item.origin
        arrived = threading.Event()
        full = min(env.settings.fetch_timeout_s, ROLLOUT_FETCH_S)
        for timeout in (min(ROLLOUT_PROBE_S, full), full - ROLLOUT_PROBE_S):
            try:
                env.fetch_rollouts(ann.blob, origin, timeout, on_progress=lambda d, _t: d and arrived.set())
                return env.store.get(ann.blob.id)
            except Exception as e:
                log.warning("rollout blob %s unavailable: %s", ann.blob.id[:12], e)
                if not arrived.is_set() or timeout <= 0:
                    break
        env.status.incr_label("rollout_unfetchable", "probe" if not arrived.is_set() else "fetch")
        return None

    def _record(
        self, ann: RolloutAnnouncement, miner: bytes, bv: BatchVerdict, secs: float, judged: bool
    ) -> None:
        st = self.env.status
        acc = sum(1 for g in bv.groups if g.accepted)
        st.incr("batches_checked")
        st.incr("groups_accepted", acc)
        st.incr("groups_rejected", len(bv.groups) - acc)
        st.incr("rollouts_accepted", sum(len(g.rollouts) for g in bv.valid_groups))
        st.incr("rollouts_rejected", (len(bv.groups) - acc) * self.env.g.generation.group_size)
        st.incr("rollouts_float32", bv.stats.rollouts_float32)  # judged again on the float32 reference
        st.incr("side_positions", bv.stats.side_positions)  # which side paid (proof.sides)
        st.incr("sides_judged", bv.stats.side_judged)
        st.incr("sides_won", bv.stats.side_won)
        st.incr("sides_lost", bv.stats.side_lost)
        for g in bv.groups:
            if not g.accepted:
                st.incr_label("rejected", g.reason)
        for k in PROOF_ERRORS:
            st.gauge_max(f"proof_{k}", getattr(bv.stats, k))
        st.gauge("check_ms", secs * 1000)
        total = sum(r.reward for grp in bv.valid_groups for r in grp.rollouts)
        count = sum(len(grp.rollouts) for grp in bv.valid_groups)
        st.add_reward(ann.version, total, count)
        cur = self.current.version
        if judged and cur - self.max_staleness - LATE_VERSIONS <= ann.version <= cur:  # a claim moves nothing
            self.scores.record(miner.hex(), ann.version, int(bv.unique_rollouts), bool(bv.hard_failure), cur)
        st.set_scores(self.scores.scores(self.current.version))
        log.info(
            "verdict %s v%d from %s: %d/%d groups accepted %s",
            ann.blob.id[:12],
            ann.version,
            miner.hex()[:12],
            acc,
            len(bv.groups),
            bv.reasons(),
        )

    def _report_backlog(self) -> None:
        """Say in status (``judging``, ``judge_backlog``, ``judge_lag_s``) and once in the log when
        judging falls behind what miners announce, so nobody waits on this validator silently."""
        with self.jq_cond:
            n, lag, held = len(self.jq), self.jq.oldest_age(), len(self.in_flight) + self._n_held()
        st = self.env.status
        st.gauge("judge_backlog", n)
        st.gauge("judge_in_hand", held)
        st.gauge("judge_lag_s", lag)
        behind = lag > BEHIND_S
        judging = f"behind: {n} queued, oldest {lag:.0f} s" if behind else "keeping up"
        if self._calibrating():
            judging += " (calibrating: genesis tolerances)" if self._tuned is None else " (measuring tolerances again)"
        st.set(judging=judging)
        if behind != self._behind:
            self._behind = behind
            (log.warning if behind else log.info)("judging %s", judging)

    def _calibrating(self) -> bool:
        return self.calibration is not None and self.calibration.is_alive()

    def _awaiting_first_tolerances(self) -> bool:
        """Judging waits up to ``FIRST_TOLERANCES_WAIT_S`` for calibration's first tolerances."""
        return (
            self._tuned is None
            and self._calibrating()
            and time.monotonic() - self._calibration_started < FIRST_TOLERANCES_WAIT_S
        )

    def _maybe_publish_scores(self) -> None:
        now = time.monotonic()
        if now - self._last_scores < SCORES_EVERY_S:
            return
        self._last_scores = now
        if self.scores.scores(self.current.version):
            for msg in self.scores.to_messages(self.current.version):
                self.env.publish("verdicts", msg)
        self._keep()

    def _keep(self) -> None:
        """What a restart takes back: the scores and each key's record of sides."""
        save_scores(self.dir / SCORES_FILE, self.scores)
        save_sides(self.dir / SIDES_FILE, self.checker.sides)

    def holds(self) -> list[str]:
        return [m.blob.id for m in self.book.all()[-8:] if self.env.store.has(m.blob.id)]

    def head(self) -> int:
        return self.current.version

    def handlers(self) -> Handlers:
        return (
            Handlers()
            .on(PatchManifest, self.sync.on_manifest)
            .on(Receipts, self.receipts.on_receipts)
            .on(RolloutAnnouncement, self.on_announcement)
        )

    def loops(self) -> dict[str, Callable[[], None]]:
        lanes = {f"fetch{lane}": partial(self.fetch_loop, lane) for lane in range(FETCHERS)}
        return {"sync": self.sync.run, "validate": self.run, **lanes}

    def pause(self) -> None:
        """Nothing to pause: verdicts answer what miners announce."""

    def close(self) -> None:
        """The newest version saved (saves are spaced while running)."""
        self.host.close()
        self.receipts.close()
        self._keep()
