"""The cheats of ``p2prl bench cheats`` that are more than a changed sampler or weights: each builds
what an attacker announces, has it judged as a network judges it, and says what it gained.

- ``steer_in_margin``: at each position where another token's interval lies within the validator's
  sampling margin of the public uniform, take whichever candidate's honest continuation earns more
  reward (a lookahead); everything else honest. Gain: steered reward over the honest draw's.
- ``steer_in_budget``: the same, steering only as many positions as each rung of the validator's
  sampling check allows a batch (an attacker who knows its rates).
- ``steer_by_misses``: the budgeted attacker who also spends the misses the sampling check allows a
  batch (uniforms beyond the margin) on the likeliest tokens that pay, wherever they are.
- ``payload_unrecomputed``: one rollout per batch replaced by a fabricated rewarded completion (the
  problem's answer), proved by the right model. Caught when the validator rejects it or the
  trainer's token check (``rl.verify``) leaves it out; ``trained`` counts its tokens a step trained on.
- ``copy_front_running``: a second key whose prompt matches the victim's copies the victim's least
  likely completion into its own honest batch and is judged first; counted is the victim's batch.
- ``key_grinding_64``: 64 keys, each with a receipt (docs/PROTOCOL.md §14), each mine the batch it
  seeds, the best is announced. Gain: the reward the trainer trains per batch of work, over an
  honest miner's (the validator cannot tell which batch was kept; the 63 chains withheld cost a chain
  start each before their keys are trained again); ``reward_gain``: the kept batch's reward alone.
- ``soft_drop``: a group made unlikely on purpose (the least likely tokens, proved by the right
  model) so the validator drops it; caught when that costs a hard failure.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2prl.proof.batch import build_batch
from p2prl.proof.miner import PreparedBatch, announce, mine_batch
from p2prl.proof.validate import BatchVerdict, RolloutValidator, ValidatorConfig

GRIND_KEYS = 64
# steering looks ahead at most this many alternatives per position, the nearest to the uniform (a flat
# model at a wide margin offers dozens; the nearest are also the cheapest for the sampling check)
MAX_ALTERNATIVES = 3


@dataclass
class Ctx:
    """What every attack needs: the network's model and version, the miner, the validator's rules."""

    setup: Any  # bench.proof.ModelSetup
    model: Any
    version: int
    mh: str
    miner: bytes
    config: ValidatorConfig
    indices: Callable[[], list[int]]
    group_size: int
    # the one validator a case's batches meet in turn, when what it remembers of a key matters (the
    # sides a steering key won, ``proof.sides``); else each batch meets a fresh one
    judge: RolloutValidator | None = None

    def validator(self, receipts: Callable[[str], frozenset[str] | None] | None = None) -> RolloutValidator:
        return RolloutValidator.for_model(
            self.model, self.setup.tokenizer, self.setup.task, self.version, self.mh, config=self.config,
            receipts=receipts,
        )

    def honest(
        self, key: bytes | None = None, idx: list[int] | None = None, chain: tuple[str, str] | None = None
    ) -> PreparedBatch:
        from p2prl.rl.engine import HFEngine

        return mine_batch(
            HFEngine(self.model, self.setup.tokenizer),
            self.setup.task,
            self.version,
            self.mh,
            key or self.miner,
            idx or self.indices(),
            self.group_size,
            self.setup.params,
            chain,
        )


@dataclass
class Outcome:
    """One attempt: rollouts at stake, accepted, group verdicts, and what the attack gained."""

    n: int
    accepted: int
    reasons: dict[str, int]
    hard: bool
    gain: float | None = None  # attack's reward / honest reward on the same footing
    trained: int | None = None  # payload tokens a training step trained on
    extra: dict[str, float] = field(default_factory=dict)


def side_extra(verdict: BatchVerdict) -> dict[str, float]:
    """What the validator's sides check (``proof.sides``) saw of one batch, for an outcome's extra."""
    return {k: float(getattr(verdict.stats, k)) for k in ("side_positions", "side_judged", "side_won", "side_lost")}


def _outcome(verdict: BatchVerdict, prepared: PreparedBatch, **kw: Any) -> Outcome:
    return Outcome(prepared.batch.n_rollouts, verdict.accepted_rollouts, verdict.reasons(), verdict.hard_failure, **kw)


def _reprove(ctx: Ctx, key: bytes, groups: list[tuple[int, list[int], list[list[int]], list[float]]]) -> PreparedBatch:
    """Announce ``(index, prompt, completions, rewards)`` with honest proofs of the right model."""
    from p2prl.rl.engine import Sample, teacher_forced

    out = []
    t, p = ctx.setup.params.temperature, ctx.setup.params.top_p
    for index, prompt, comps, rewards in groups:
        samples = []
        for ids in comps:
            lp, h = teacher_forced(ctx.model, prompt, ids, t, p)
            samples.append(Sample(prompt, ids, lp.tolist(), h))
        out.append((index, prompt, samples, rewards))
    return announce(build_batch(ctx.version, ctx.mh, key, out))


def _groups_of(prepared: PreparedBatch) -> list[tuple[int, list[int], list[list[int]], list[float]]]:
    return [
        (g.index, g.prompt_ids.tolist(), [r.completion_ids.tolist() for r in g.rollouts], [r.reward for r in g.rollouts])
        for g in prepared.batch.groups
    ]


# -- steering inside the margin -----------------------------------------------------------------------
def _next_logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1:].float()


def _complete(ctx: Ctx, prompt: list[int], prefix: list[int], u: np.ndarray) -> list[int]:
    """The honest continuation of ``prefix``: each later token the inverse CDF of its uniform (an
    attacker's estimate, so with a KV cache: one token's forward per step)."""
    import torch

    from p2prl.rl.sampling import pick_tokens

    stop = set(ctx.setup.tokenizer.stop_ids)
    out = list(prefix)
    params = ctx.setup.params
    past, feed = None, prompt + out
    with torch.no_grad():
        while len(out) < params.max_new_tokens and not (out and out[-1] in stop):
            o = ctx.model(input_ids=torch.tensor([feed]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            logits = o.logits[0, -1:].float()
            out.append(int(pick_tokens(logits, u[len(out) : len(out) + 1], params.temperature, params.top_p)[0]))
            feed = out[-1:]
    return out


def _complete_many(ctx: Ctx, prompt: list[int], prefix: list[int], firsts: list[int], u: np.ndarray) -> list[list[int]]:
    """:func:`_complete` of ``prefix + [c]`` for each ``c`` in ``firsts``, in one batch (the rows stay
    of one length: a row that stopped keeps being fed and its tokens past the stop are dropped)."""
    import torch

    from p2prl.rl.sampling import pick_tokens

    stop = set(ctx.setup.tokenizer.stop_ids)
    params = ctx.setup.params
    outs = [[*prefix, c] for c in firsts]
    done = [o[-1] in stop for o in outs]
    past, feed = None, torch.tensor([prompt + o for o in outs])
    with torch.no_grad():
        while len(outs[0]) < params.max_new_tokens and not all(done):
            o = ctx.model(input_ids=feed, past_key_values=past, use_cache=True)
            past = o.past_key_values
            t = len(outs[0])
            nxt = pick_tokens(o.logits[:, -1].float(), np.full(len(outs), u[t]), params.temperature, params.top_p)
            for k, tok_id in enumerate(nxt.tolist()):
                outs[k].append(int(tok_id))
            feed = nxt.reshape(-1, 1)
            done = [d or r[-1] in stop for d, r in zip(done, outs, strict=True)]
    return [_cut_at_stop(r, len(prefix), stop) for r in outs]


def _cut_at_stop(ids: list[int], start: int, stop: set[int]) -> list[int]:
    for k in range(start, len(ids)):
        if ids[k] in stop:
            return ids[: k + 1]
    return ids


def _candidates(
    logits: Any, u: float, margin: float, temperature: float, top_p: float, likeliest: int = 0
) -> dict[int, float]:
    """Tokens whose interval lies within ``margin`` of ``u``, each with its distance (the honest
    pick among them, at 0), and the ``likeliest`` most probable tokens wherever their intervals lie."""
    from p2prl.rl.sampling import processed_probs

    p = processed_probs(logits, temperature, top_p)[0]
    total = p.sum()
    hi = p.cumsum(0) / total
    lo = hi - p / total
    d = np.maximum(0.0, np.maximum(lo.numpy() - u, u - hi.numpy()))
    near = np.flatnonzero((d <= margin) & (p.numpy() > 0))
    near = near[np.argsort(d[near], kind="stable")][: 1 + MAX_ALTERNATIVES]  # the honest pick first (d 0)
    out = {int(i): float(d[i]) for i in near}
    if likeliest:
        for i in np.argsort(-p.numpy(), kind="stable")[:likeliest]:
            out.setdefault(int(i), float(d[i]))
    return out


def rung_budgets(cfg: ValidatorConfig, n: int) -> list[int]:
    """Per rung of the sampling check, how many uniforms of ``n`` checked tokens may lie past it
    before the batch fails: what an attacker who knows the validator's rates may steer."""
    from p2prl.proof import failing_count

    alpha = cfg.sampling_alpha / max(1, len(cfg.sampling_rungs))
    return [failing_count(n, rate, alpha) - 1 for rate in cfg.sampling_rung_rates]


def steer_in_margin(ctx: Ctx, budgeted: bool = False, misses: bool = False) -> Outcome:
    """Steer every choice the margin leaves toward reward, or (``budgeted``) only as many as each
    rung of the sampling check allows a batch of this size, the largest gains first come first;
    ``misses``: budgeted, and also the misses the check allows, each on one of the likeliest tokens."""
    from p2prl.rl.sampling import pick_tokens, sample_key, uniforms
    from p2prl.rl.tasks import derive_seed

    tok, task, params = ctx.setup.tokenizer, ctx.setup.task, ctx.setup.params
    cfg = ctx.config
    margin = cfg.sampling_margin
    rows = []
    for i in ctx.indices():
        problem = task.problem(derive_seed(ctx.mh, ctx.miner, i))
        prompt = tok.encode_prompt(problem.prompt)
        us = [uniforms(sample_key(ctx.mh, ctx.miner, i, j), params.max_new_tokens) for j in range(ctx.group_size)]
        rows.append((i, problem, prompt, us, [_complete(ctx, prompt, [], u) for u in us]))
    n_tokens = sum(len(c) for *_, honest in rows for c in honest)
    budget = rung_budgets(cfg, n_tokens) if budgeted or misses else None
    if budget is not None and misses:  # the misses a batch of n_tokens may hold, the last entry
        from p2prl.proof import failing_count

        budget.append(failing_count(n_tokens, cfg.sampling_miss_rate, cfg.sampling_alpha) - 1)
    groups, honest_r, steered_r, ambiguous, steered = [], 0.0, 0.0, 0, 0
    for i, problem, prompt, us, honest in rows:
        comps, rewards = [], []
        for u, honest_ids in zip(us, honest, strict=True):
            out: list[int] = []
            stop = set(tok.stop_ids)
            while len(out) < params.max_new_tokens and not (out and out[-1] in stop):
                t = len(out)
                logits = _next_logits(ctx.model, prompt + out)
                cands = _candidates(
                    logits, float(u[t]), margin, params.temperature, params.top_p, MAX_ALTERNATIVES if misses else 0
                )
                honest_tok = int(pick_tokens(logits, u[t : t + 1], params.temperature, params.top_p)[0])
                best, best_r = honest_tok, None
                tried = [honest_tok] + [
                    c for c in cands if c != honest_tok and (budget is None or _affordable(cfg, budget, cands[c]))
                ]
                ambiguous += len(cands) > 1
                if len(tried) > 1:  # a choice the attacker can still afford
                    # every candidate's honest continuation in one batched lookahead
                    for c, ids in zip(tried, _complete_many(ctx, prompt, out, tried, u), strict=True):
                        r = task.reward(problem, tok.decode(ids))
                        if best_r is None or r > best_r:
                            best, best_r = c, r
                if best != honest_tok:
                    steered += 1
                    if budget is not None:
                        _spend(cfg, budget, cands[best])
                out.append(best)
            honest_r += task.reward(problem, tok.decode(honest_ids))
            r = task.reward(problem, tok.decode(out))
            steered_r += r
            comps.append(out)
            rewards.append(r)
        groups.append((i, prompt, comps, rewards))
    prepared = _reprove(ctx, ctx.miner, groups)
    v = (ctx.judge or ctx.validator()).check(prepared.announcement, ctx.miner, prepared.blob, ctx.version)
    gain = steered_r / honest_r if honest_r else (1.0 if steered_r == 0 else float("inf"))
    earned = sum(r.reward for g in v.valid_groups for r in g.rollouts)
    extra = {
        "ambiguous_positions": float(ambiguous),
        "steered": float(steered),
        "honest_reward": honest_r,  # what the honest draw of the same prompts and uniforms earns
        "earned_reward": float(earned),  # what the steered batch's accepted groups earn
        **side_extra(v),
    }
    return _outcome(v, prepared, gain=gain, extra=extra)


def _affordable(cfg: ValidatorConfig, budget: list[int], d: float) -> bool:
    """Whether a steer at distance ``d`` fits every rung's budget it counts on (and, past the margin,
    the misses' budget: the entry after the rungs, absent when misses are not spent)."""
    if d > cfg.sampling_margin and (len(budget) == len(cfg.sampling_rungs) or budget[-1] <= 0):
        return False
    return all(b > 0 for f, b in zip(cfg.sampling_rungs, budget, strict=False) if d > cfg.sampling_margin * f)


def _spend(cfg: ValidatorConfig, budget: list[int], d: float) -> None:
    for k, f in enumerate(cfg.sampling_rungs):
        if d > cfg.sampling_margin * f:
            budget[k] -= 1
    if d > cfg.sampling_margin:
        budget[-1] -= 1


# -- a payload nobody recomputed ------------------------------------------------------------------------
def _trained_payloads(ctx: Ctx, verdict: BatchVerdict, where: set[tuple[int, int]]) -> int:
    """Of the payload rollouts ``where`` (prompt index, sample) the validator accepted, how many
    tokens a trainer's step trains on (``GRPOTrainer`` with its token check, at staleness 0)."""
    from p2prl.rl.grpo import GRPOConfig, GRPOTrainer

    accepted = [(g, j) for g in verdict.valid_groups for j in range(len(g.rollouts)) if (g.index, j) in where]
    if not accepted:
        return 0
    params = ctx.setup.params
    t = GRPOTrainer(copy.deepcopy(ctx.model).float(), GRPOConfig(temperature=params.temperature, top_p=params.top_p))
    t.step(copy.deepcopy(verdict.valid_groups))
    # a group whose rewards are all equal is not trained on at all
    return sum(t.trained_tokens.get((g.miner, g.index, j), (0, 0))[0] for g, j in accepted)


def payload_unrecomputed(ctx: Ctx) -> Outcome:
    from p2prl.rl.tasks import derive_seed

    honest = ctx.honest()
    groups = _groups_of(honest)
    where = set()
    for gi, (index, prompt, comps, rewards) in enumerate(groups[:1]):
        problem = ctx.setup.task.problem(derive_seed(ctx.mh, ctx.miner, index))
        payload = ctx.setup.tokenizer.encode(problem.answer)[: ctx.setup.params.max_new_tokens]
        j = int(np.argmin(rewards))
        comps[j] = payload
        rewards[j] = ctx.setup.task.reward(problem, ctx.setup.tokenizer.decode(payload))
        groups[gi] = (index, prompt, comps, rewards)
        where.add((index, j))
    prepared = _reprove(ctx, ctx.miner, groups)
    v = (ctx.judge or ctx.validator()).check(prepared.announcement, ctx.miner, prepared.blob, ctx.version)
    return _outcome(v, prepared, trained=_trained_payloads(ctx, v, where), extra=side_extra(v))


# -- copy front-running -------------------------------------------------------------------------------
def copy_front_running(ctx: Ctx, attacker: bytes) -> Outcome:
    """The victim (``ctx.miner``) mines honestly; ``attacker`` finds one of its own prompt indices
    with the victim's first problem, copies the victim's least likely completion into its batch for
    it and is judged first. The outcome is the victim's batch."""
    from p2prl.rl.engine import teacher_forced
    from p2prl.rl.tasks import derive_seed

    task = ctx.setup.task
    victim = ctx.honest()
    g0 = victim.batch.groups[0]
    want = task.problem(derive_seed(ctx.mh, ctx.miner, g0.index))
    a_index = next(k for k in range(1_000_000) if task.problem(derive_seed(ctx.mh, attacker, k)) == want)
    prompt = g0.prompt_ids.tolist()
    t, p = ctx.setup.params.temperature, ctx.setup.params.top_p
    lps = [float(teacher_forced(ctx.model, prompt, r.completion_ids.tolist(), t, p)[0].sum()) for r in g0.rollouts]
    src = g0.rollouts[int(np.argmin(lps))]
    honest = ctx.honest(key=attacker, idx=[a_index])
    (index, aprompt, comps, rewards), = _groups_of(honest)
    comps[0], rewards[0] = src.completion_ids.tolist(), src.reward
    attack = _reprove(ctx, attacker, [(index, aprompt, comps, rewards)])
    v = ctx.validator()
    first = v.check(attack.announcement, attacker, attack.blob, ctx.version)
    second = v.check(victim.announcement, ctx.miner, victim.blob, ctx.version)
    copied = _trained_payloads(ctx, first, {(index, 0)})
    return _outcome(
        second, victim, trained=copied, extra={"attacker_hard": float(first.hard_failure), "copy_logprob": min(lps)}
    )


# -- key grinding -------------------------------------------------------------------------------------
def key_grinding(ctx: Ctx, keys: int = GRIND_KEYS) -> Outcome:
    """``keys`` keys, each holding the trainer's receipt of an accepted batch (chains in standing:
    a fresh key's batch is a chain start, trained by nobody), each mine the batch their receipt seeds;
    the best is announced. Judged by a validator holding the trainer's list; the gain is what the
    trainer trains per batch of work against an honest miner of the same keys: the best batch, for
    its ``keys`` batches and the ``keys - 1`` chain starts that rebuild the chains it broke."""
    import hashlib

    from p2prl.protocol import receipt_id

    idx = list(range(len(ctx.indices())))  # a chained batch's prompts are 0, 1, … of its seed
    grinders = [hashlib.sha256(b"grind" + k.to_bytes(4, "big") + bytes(ctx.miner)).digest() for k in range(keys)]
    prevs = [hashlib.sha256(b"prev" + key).hexdigest() for key in grinders]
    digest = hashlib.sha256(b"the trainer's receipts list" + bytes(ctx.miner)).hexdigest()
    listed = frozenset(receipt_id(key, prev) for key, prev in zip(grinders, prevs, strict=True))
    best, rewards = None, []
    for key, prev in zip(grinders, prevs, strict=True):
        p = ctx.honest(key=key, idx=idx, chain=(prev, digest))
        r = float(np.mean([ro.reward for g in p.batch.groups for ro in g.rollouts]))
        rewards.append(r)
        if best is None or r > best[0]:
            best = (r, key, p)
    assert best is not None
    r, key, prepared = best
    v = ctx.validator(receipts={digest: listed}.get).check(prepared.announcement, key, prepared.blob, ctx.version)
    mean = float(np.mean(rewards))
    work = 2 * keys - 1  # batches mined, then the chain starts that rebuild the chains withheld
    return _outcome(
        v,
        prepared,
        gain=r / (work * mean) if mean else 0.0,
        extra={"reward_gain": r / mean if mean else 1.0, "batches_of_work": float(work), "trained_batches": 1.0},
    )


# -- a group dropped at will --------------------------------------------------------------------------
def soft_drop(ctx: Ctx) -> Outcome:
    import torch

    honest = ctx.honest()
    groups = _groups_of(honest)
    index, prompt, comps, rewards = groups[0]
    comp: list[int] = []
    special = max(3, max(ctx.setup.tokenizer.stop_ids, default=0) + 1)  # never a special token
    with torch.no_grad():
        for _ in range(min(3, ctx.setup.params.max_new_tokens)):
            logits = _next_logits(ctx.model, prompt + comp)[0]
            comp.append(int(torch.argmin(logits[special:])) + special)
    from p2prl.rl.tasks import derive_seed

    problem = ctx.setup.task.problem(derive_seed(ctx.mh, ctx.miner, index))
    comps[0], rewards[0] = comp, ctx.setup.task.reward(problem, ctx.setup.tokenizer.decode(comp))
    groups[0] = (index, prompt, comps, rewards)
    prepared = _reprove(ctx, ctx.miner, groups)
    v = ctx.validator().check(prepared.announcement, ctx.miner, prepared.blob, ctx.version)
    return _outcome(v, prepared)
