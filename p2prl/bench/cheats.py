"""``p2prl bench cheats``: one table, case → accepted/n, judged by a validator at node defaults,
at a vLLM network's settings and at the cross-engine defaults.

The ``node`` column's validator is what ``p2prl node --role validator`` runs with no proof flags:
tolerances calibrated on its own engine at start, every rollout recomputed, the sampling check on.
The ``vllm`` column's is what ``p2prl demo --engine vllm`` gives a validator of vLLM miners
(``--reference-engine vllm``): tolerances calibrated on reference batches vLLM mines, and its honest
case is mined by vLLM (skipped where vLLM cannot run the model). The ``cross`` column's is what
docs/OPERATOR.md gives a validator on another device than its miners: ``--no-calibrate-tolerances``,
the fixed cross-engine defaults of ``ValidatorConfig``, what such a validator judges with where the
genesis pins nothing. The ``pinned`` column's is what it judges with where the founder pinned
``--pin-tolerances hf,hf-avx2``: tolerances from reference batches of this CPU's kernels and an AVX2
CPU's (``node.weights.isa``, no time cap), and its honest case is mined with AVX2's kernels. The attacks of ``bench.attacks`` (steering inside the margin, a payload nobody
recomputed, copy front-running, key grinding, a group dropped at will) add what they gained. Every case is a real miner
built from the same parts with one thing changed: cheaper weights (int8, fp8, a low-rank perturbation),
older versions, another model of the same shape, a sharpened sampler that still reports honest T=1
logprobs and hidden states, a batch re-drawn N times with the best kept, or the best samples of a
larger draw kept. The default model is trained a few GRPO-shaped steps first (the node's learning
rate), so versions differ as they do in a network.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2prl.bench.attacks import (
    Ctx,
    Outcome,
    copy_front_running,
    key_grinding,
    payload_unrecomputed,
    side_extra,
    soft_drop,
    steer_in_margin,
)
from p2prl.bench.proof import (
    GROUP_SIZE,
    TOLERANCES,
    ModelSetup,
    generation_spec,
    int8_round_trip,
    manifest_of,
    setups,
    train_versions,
)
from p2prl.proof.batch import build_batch
from p2prl.proof.calibrate import calibrate
from p2prl.proof.miner import PreparedBatch, announce, mine_batch, sample_keys
from p2prl.proof.validate import RolloutValidator, ValidatorConfig

MINER = bytes(range(64, 96))
GROUPS_PER_BATCH = 16  # the demo genesis' batch shape: 16 groups of 8
STALE_KS = (1, 2, 4, 8)
BEST_OF = (2, 4, 16)
CASES = (
    "honest",
    "int8",
    "fp8",
    "lowrank_1pct",
    "lowrank_3pct",
    *(f"stale_{k}" for k in STALE_KS),
    "other_model",
    "temperature_0.6",
    "temperature_0.8",
    "top_p_0.8",
    "greedy",
    *(f"best_of_{n}" for n in BEST_OF),
    "best_of_samples",
    "steer_in_margin",
    "steer_in_budget",
    "steer_by_misses",
    "payload_unrecomputed",
    "copy_front_running",
    "key_grinding_64",
    "soft_drop",
)
# node: calibrated on the validator's own engine (its miners on the same engine); vllm: calibrated on
# reference batches vLLM mines, honest batches mined by vLLM (a vLLM network: `--reference-engine
# vllm`; where vLLM runs the model); cross: the uncalibrated cross-engine defaults (a validator on
# another device than its miners)
COLUMNS = ("node", "vllm", "pinned", "cross")
ATTACKER = bytes(range(96, 128))  # copy front-running's second key


def fp8_round_trip(model: Any) -> Any:
    """Every matrix through float8 e4m3 and back to bf16."""
    import torch

    q = copy.deepcopy(model)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                p.copy_(p.float().to(torch.float8_e4m3fn).float().to(p.dtype))
    return q


def low_rank(model: Any, frac: float, rank: int = 4, seed: int = 0) -> Any:
    """Every matrix plus a random rank-``rank`` matrix of ``frac`` of its Frobenius norm."""
    import torch

    q = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                a = torch.randn(p.shape[0], rank, generator=g)
                b = torch.randn(rank, p.shape[1], generator=g)
                d = a @ b
                p.copy_((p.float() + d * (frac * p.float().norm() / d.norm())).to(p.dtype))
    return q


def _prove(
    model: Any, version: int, mh: str, groups: list[tuple[int, list[int], list[Any], list[float]]]
) -> PreparedBatch:
    """A batch of the given token sequences with honest T=1 proofs from ``model``: logprobs and hidden
    states recomputed teacher-forced, as a miner that cheats only in its sampler reports them."""
    from p2prl.rl.engine import Sample, teacher_forced

    out = []
    for index, prompt, samples, rewards in groups:
        proved = []
        for s in samples:
            lp, h = teacher_forced(model, prompt, s.completion_ids, 1.0, 1.0)
            proved.append(Sample(prompt, s.completion_ids, lp.tolist(), h))
        out.append((index, prompt, proved, rewards))
    return announce(build_batch(version, mh, MINER, out))


def _draw(
    setup: ModelSetup, model: Any, mh: str, indices: list[int], n: int, params: Any, keys: Any
) -> list[Any]:
    """``n`` samples per prompt of ``indices`` (rewarded), with ``keys`` or the engine's own seed."""
    from p2prl.rl.engine import HFEngine
    from p2prl.rl.tasks import derive_seed

    tok = setup.tokenizer
    problems = [setup.task.problem(derive_seed(mh, MINER, i)) for i in indices]
    prompts = [tok.encode_prompt(p.prompt) for p in problems]
    samples = HFEngine(model, tok).generate(prompts, n, params, keys)
    return [
        (i, prompt, group, [setup.task.reward(p, tok.decode(s.completion_ids)) for s in group])
        for i, p, prompt, group in zip(indices, problems, prompts, samples, strict=True)
    ]


def _vllm_engine(model: Any, tokenizer: Any, stack: contextlib.ExitStack) -> Any:
    """A vLLM miner on ``model`` (written to a temporary directory, eager, on the CPU; closed with
    ``stack``), or why there is none (not installed, or a model vLLM's CPU build cannot run: the
    default model's heads of 16)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    from p2prl.bench.proof import vllm_miner

    return vllm_miner(model, tokenizer, "cpu", stack)


def _reward(groups: list[Any]) -> float:
    return sum(sum(r) for *_, r in groups) / max(1, sum(len(r) for *_, r in groups))


def run(
    cache_dir: Path,
    rollouts: int = 256,
    train_steps: int = 8,
    lr: float | None = None,
    log: Callable[[str], None] = print,
    columns: tuple[str, ...] = COLUMNS,
    cases: tuple[str, ...] = CASES,
    model_name: str = "tiny",
    forward_float32: bool = False,
) -> dict[str, Any]:
    """Every case of ``cases`` in every column of ``columns`` on ``model_name`` (tiny: the default model,
    big: the 24M configuration, real: SmolLM2-135M-Instruct); returns the tables, tolerances and
    timings. ``forward_float32``: every validator recomputes in float32 (``--forward-float32``)."""
    from p2prl.rl import MODEL_LR
    from p2prl.rl.local import DEFAULT_LR

    setup = setups(cache_dir, (model_name,))[0]
    if model_name == "big":  # a random-init model never adds: reward it for starting with a digit
        from p2prl.rl.tasks import get_task

        setup = dataclasses.replace(setup, task=get_task("digit-start", digits=2))
    # a pretrained model at the demo's rate for it: the toy's would undo its training in a few steps
    lr = lr or (MODEL_LR if model_name == "real" else DEFAULT_LR)
    versions = train_versions(setup, train_steps, lr)
    cur = len(versions) - 1
    model = versions[cur]
    mh = manifest_of(model)
    params = setup.params
    base = ValidatorConfig(
        generation=generation_spec(params, groups_per_batch=GROUPS_PER_BATCH),
        max_staleness=max(STALE_KS),
        forward_float32=forward_float32,
    )
    t0 = time.perf_counter()
    calibrated, drift = calibrate(model, setup.tokenizer, setup.task, params, mh, base)
    calibrate_s = time.perf_counter() - t0
    log(f"calibrated in {calibrate_s:.1f} s: {drift}")
    configs = {"node": calibrated, "cross": base}
    drifts: dict[str, dict[str, float]] = {"node": drift}
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as engines:  # the columns' own miners close when the run ends
        own: dict[str, Any] = {}  # a column's honest miner: vLLM's, or an AVX2 CPU's kernels
        if "vllm" in columns:
            on_vllm = _vllm_engine(model, setup.tokenizer, engines)
            if isinstance(on_vllm, str):
                skipped["vllm"] = on_vllm
            else:
                own["vllm"] = on_vllm
                t0 = time.perf_counter()
                configs["vllm"], drifts["vllm"] = calibrate(
                    model, setup.tokenizer, setup.task, params, mh, base, other_engines=(lambda _bs: on_vllm,)
                )
                log(f"calibrated on vLLM's reference batches in {time.perf_counter() - t0:.1f} s: {drifts['vllm']}")
        if "pinned" in columns:
            from p2prl.node.weights.isa import IsaEngine

            older = IsaEngine("avx2", model, setup.tokenizer)
            engines.callback(older.close)
            own["pinned"] = older
            t0 = time.perf_counter()
            configs["pinned"], drifts["pinned"] = calibrate(
                model, setup.tokenizer, setup.task, params, mh, base, other_engines=(older.sized,), more_s=math.inf
            )
            log(f"pinned from this CPU's and {older.capability}'s batches in {time.perf_counter() - t0:.1f} s: {drifts['pinned']}")
        columns = tuple(c for c in columns if c not in skipped)
        for c, why in skipped.items():
            log(f"{c}: skipped ({why})")
        n_batches = max(1, -(-rollouts // (GROUP_SIZE * GROUPS_PER_BATCH)))
        trial = _Run(setup, versions, cur, mh)
        tables: dict[str, list[dict[str, Any]]] = {}
        for column in columns:
            cfg = configs[column]
            log(f"{column}: {_tolerances(cfg)}")
            tables[column] = [
                trial.case(case, cfg, own.get(column), n_batches, timed=column == columns[0], log=log)
                for case in cases
            ]
    return {
        "columns": tables,
        "cases": tables[columns[0]],
        "tolerances": {c: _tolerances(configs[c]) for c in columns},
        "skipped": skipped,
        "calibration": drift,
        "calibrations": drifts,  # per column calibrated: what its reference batches measured
        "calibrate_s": calibrate_s,
        "generate_s": trial.gen_s,
        "verify_s": trial.verify_s,
        "verify_fraction": trial.verify_s / trial.gen_s if trial.gen_s else 0.0,
        "train_steps": train_steps,
        "lr": lr,
        "model": model_name,
        "rollouts_per_case": n_batches * GROUP_SIZE * GROUPS_PER_BATCH,
    }


class _Run:
    """The cases of one ``run`` on one trained model: each batch takes the next prompt indices, so no
    two batches of a run share a prompt; honest generation and verification times add up."""

    def __init__(self, setup: ModelSetup, versions: list[Any], cur: int, mh: str) -> None:
        self.setup, self.versions, self.cur, self.mh = setup, versions, cur, mh
        self.model = versions[cur]
        self.gen_s = self.verify_s = 0.0
        self._next = 0

    def indices(self) -> list[int]:
        first, self._next = self._next, self._next + GROUPS_PER_BATCH
        return list(range(first, first + GROUPS_PER_BATCH))

    def honest_batch(self, m: Any, engine: Any = None) -> PreparedBatch:
        from p2prl.rl.engine import HFEngine

        s = self.setup
        eng = engine if engine is not None else HFEngine(m, s.tokenizer)
        return mine_batch(eng, s.task, self.cur, self.mh, MINER, self.indices(), GROUP_SIZE, s.params)

    def sharpened(self, **change: Any) -> PreparedBatch:
        idx = self.indices()
        p = dataclasses.replace(self.setup.params, **change)
        keys = sample_keys(self.mh, MINER, idx, GROUP_SIZE)
        return _prove(self.model, self.cur, self.mh, _draw(self.setup, self.model, self.mh, idx, GROUP_SIZE, p, keys))

    def best_of(self, n: int) -> PreparedBatch:
        idx = self.indices()
        draws = [
            _draw(self.setup, self.model, self.mh, idx, GROUP_SIZE, dataclasses.replace(self.setup.params, seed=s), None)
            for s in range(n)
        ]
        return _prove(self.model, self.cur, self.mh, max(draws, key=_reward))

    def best_samples(self) -> PreparedBatch:
        idx = self.indices()
        keys = sample_keys(self.mh, MINER, idx, 2 * GROUP_SIZE)
        groups = _draw(self.setup, self.model, self.mh, idx, 2 * GROUP_SIZE, self.setup.params, keys)
        kept = []
        for i, prompt, samples, rewards in groups:
            order = sorted(range(len(samples)), key=lambda j: (-rewards[j], len(samples[j].completion_ids)))
            top = order[:GROUP_SIZE]
            kept.append((i, prompt, [samples[j] for j in top], [rewards[j] for j in top]))
        return _prove(self.model, self.cur, self.mh, kept)

    def variant(self, case: str) -> PreparedBatch:
        """A batch of a case that only changes how it is made (model, sampler, selection)."""
        model, versions, cur = self.model, self.versions, self.cur
        if case == "honest":
            return self.honest_batch(model)
        if case in ("int8", "fp8"):
            return self.honest_batch((int8_round_trip if case == "int8" else fp8_round_trip)(model))
        if case.startswith("lowrank_"):
            return self.honest_batch(low_rank(model, {"lowrank_1pct": 0.01, "lowrank_3pct": 0.03}[case]))
        if case.startswith("stale_"):
            return self.honest_batch(versions[cur - int(case.split("_")[1])])
        if case == "other_model":
            return self.honest_batch(self.setup.other)
        if case.startswith("temperature_"):
            return self.sharpened(temperature=float(case.split("_")[1]))
        if case == "top_p_0.8":
            return self.sharpened(top_p=0.8)
        if case == "greedy":
            return self.sharpened(temperature=0.0)
        if case == "best_of_samples":
            return self.best_samples()
        if case.startswith("best_of_"):
            return self.best_of(int(case.split("_")[2]))
        raise ValueError(f"unknown case {case!r}")

    def case(
        self,
        case: str,
        cfg: ValidatorConfig,
        own: Any,
        n_batches: int,
        timed: bool,
        log: Callable[[str], None],
    ) -> dict[str, Any]:
        """``n_batches`` of ``case`` judged at ``cfg``: accepted rollouts, reasons, hard failures, and
        an attack's gain. ``own``: the column's honest miner (vLLM, an AVX2 CPU's kernels) for the
        honest case; ``timed``: honest generation and verification times count."""
        s = self.setup
        ctx = Ctx(s, self.model, self.cur, self.mh, MINER, cfg, self.indices, GROUP_SIZE)
        if case in ("honest", "payload_unrecomputed") or case.startswith("steer_"):  # one validator: it keeps the key's sides
            ctx = dataclasses.replace(ctx, judge=ctx.validator())
        row: dict[str, Any] = {"case": case, "n": 0, "accepted": 0, "reasons": {}, "hard": 0, "batches": 0}
        gains: list[float] = []
        for _ in range(n_batches):
            t1 = time.perf_counter()
            if case in ATTACKS:
                out = ATTACKS[case](ctx)
            else:
                prepared = self.honest_batch(self.model, own) if case == "honest" and own is not None else self.variant(case)
                t2 = time.perf_counter()
                v = ctx.judge or RolloutValidator.for_model(self.model, s.tokenizer, s.task, self.cur, self.mh, config=cfg)
                verdict = v.check(prepared.announcement, MINER, prepared.blob, self.cur)
                t3 = time.perf_counter()
                if case == "honest" and timed:
                    self.gen_s += t2 - t1
                    self.verify_s += t3 - t2
                out = Outcome(
                    prepared.batch.n_rollouts,
                    verdict.accepted_rollouts,
                    verdict.reasons(),
                    verdict.hard_failure,
                    extra=side_extra(verdict),
                )
            row["batches"] += 1
            row["n"] += out.n
            row["accepted"] += out.accepted
            row["hard"] += int(out.hard)
            for r, c in out.reasons.items():
                row["reasons"][str(r)] = row["reasons"].get(str(r), 0) + c
            if out.gain is not None:
                gains.append(out.gain)
            if out.trained is not None:
                row["trained"] = row.get("trained", 0) + out.trained
            for k, x in out.extra.items():
                row.setdefault("extra", {})[k] = row.get("extra", {}).get(k, 0.0) + x
        if gains:
            row["gain"] = float(sum(gains) / len(gains))
        extra = row.get("extra", {})
        if extra.get("honest_reward"):  # what the attack earned in accepted groups, over the honest draw
            row["earned_gain"] = extra["earned_reward"] / extra["honest_reward"]
        more = "".join(f" {k}={row[k]:.3g}" for k in ("gain", "earned_gain", "trained") if k in row)
        log(f"  {case:20s} {row['accepted']:4d}/{row['n']:<4d} hard {row['hard']}/{row['batches']}{more} {row['reasons']}")
        return row


ATTACKS: dict[str, Callable[[Ctx], Outcome]] = {
    "steer_in_margin": steer_in_margin,
    "steer_in_budget": lambda c: steer_in_margin(c, budgeted=True),
    "steer_by_misses": lambda c: steer_in_margin(c, budgeted=True, misses=True),
    "payload_unrecomputed": payload_unrecomputed,
    "copy_front_running": lambda c: copy_front_running(c, ATTACKER),
    "key_grinding_64": key_grinding,
    "soft_drop": soft_drop,
}


def _tolerances(cfg: ValidatorConfig) -> dict[str, float]:
    return {k: getattr(cfg, k) for k in TOLERANCES}
