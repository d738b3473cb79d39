"""Each validator check: an honest batch passes it, a batch broken in exactly that way fails with its code."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from proofkit import GROUP, MH, MINER, OTHER_MINER, VERSION, World, retarget

from p2prl.proof import validate as V
from p2prl.proof.batch import build_batch
from p2prl.proof.miner import announce
from p2prl.proof.validate import ValidatorConfig, fisher_log_pvalue, to_verdict
from p2prl.protocol import Genesis
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.examples import examples
from p2prl.protocol.messages import Verdict
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import Sample, teacher_forced
from p2prl.rl.tasks import derive_seed


def _reasons(verdict: V.BatchVerdict) -> set[str]:
    return {g.reason for g in verdict.groups}


def test_honest_accepted_across_batch_sizes_and_threads(world: World) -> None:
    v = world.validator()
    for i, bs in enumerate((1, 8, 32)):
        p = world.mine(indices=(2 * i, 2 * i + 1), batch=bs, seed=i)
        verdict = v.check(p.announcement, MINER, p.blob, VERSION)
        assert _reasons(verdict) == {R.OK}, verdict.reasons()
        assert verdict.accepted_rollouts == p.batch.n_rollouts and not verdict.hard_failure
        assert verdict.unique_rollouts >= 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        p = world.mine(indices=(10, 11), seed=9)
    finally:
        torch.set_num_threads(threads)
    verdict = v.check(p.announcement, MINER, p.blob, VERSION + 2)  # staleness 2 is within the bound
    assert _reasons(verdict) == {R.OK}
    g = verdict.valid_groups[0]
    assert g.version == VERSION and g.miner == MINER.hex() and g.problem is not None
    assert g.rollouts[0].completion_ids == p.batch.groups[0].rollouts[0].completion_ids.tolist()


def test_other_weights_rejected_by_fingerprint(world: World) -> None:
    p = world.mine(model=world.other, indices=(20, 21))
    verdict = world.validator().check(p.announcement, MINER, p.blob, VERSION)
    # the first lie found stops the model work: the later groups are not checked
    assert [g.reason for g in verdict.groups] == [R.FINGERPRINT, R.NOT_CHECKED]
    assert verdict.hard_failure and not verdict.valid_groups


def test_tampered_reward_rejected(world: World) -> None:
    p = world.mine(indices=(22, 23))
    b = copy.deepcopy(p.batch)
    b.groups[1].rollouts[2].reward = 1.0 - b.groups[1].rollouts[2].reward
    q = announce(b)
    verdict = world.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert [g.reason for g in verdict.groups] == [R.NOT_CHECKED, R.REWARD]


def test_tampered_logprobs_rejected(world: World) -> None:
    p = world.mine(indices=(24, 25))
    b = copy.deepcopy(p.batch)
    b.groups[0].rollouts[0].logprobs = b.groups[0].rollouts[0].logprobs - 0.5
    q = announce(b)
    verdict = world.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.groups[0].reason == R.LOGPROB


def test_one_tokens_logprob_past_its_bound_is_accepted_and_far_past_it_fails_hard(world: World) -> None:
    """Honest numerics have a heavy tail on unlikely tokens: one token's logprob past the bound but
    within twice it is accepted and counted (dropping the group would be a soft drop any miner could
    cause at will); farther is a lie (``logprob``, hard)."""
    cfg = replace(world.config, logprob_tol_mean=1.0, logprob_tol_max=0.4)
    p = world.mine(indices=(26, 27))

    def judged(lie: float) -> Any:
        b = copy.deepcopy(p.batch)
        r = b.groups[0].rollouts[0]
        r.logprobs = r.logprobs.copy()
        r.logprobs[0] -= lie
        q = announce(b)
        return world.validator(config=cfg).check(q.announcement, MINER, q.blob, VERSION)

    v = judged(0.6)
    assert _reasons(v) == {R.OK} and v.stats.logprob_tail_rollouts == 1
    assert 0.4 < v.stats.logprob_err_max <= 0.8
    v = judged(1.2)
    assert v.groups[0].reason == R.LOGPROB and v.hard_failure


def test_a_group_dropped_softly_is_still_judged_for_a_hard_failure(world: World) -> None:
    """A soft reason of one rollout (here ``distribution``, made common by a loose alpha) does not
    cover another model's states in the next rollout of its group."""
    cfg = replace(world.config, distribution_alpha=0.999)
    p = world.mine(indices=(28, 29))
    v = world.validator(config=cfg).check(p.announcement, MINER, p.blob, VERSION)
    assert R.DISTRIBUTION in _reasons(v) and not v.hard_failure
    b = copy.deepcopy(p.batch)
    b.groups[0].rollouts[-1].sketches = (b.groups[0].rollouts[-1].sketches + 97).astype(np.uint8)
    q = announce(b)
    v = world.validator(config=cfg).check(q.announcement, MINER, q.blob, VERSION)
    assert v.groups[0].reason == R.FINGERPRINT and v.hard_failure


def test_unlikely_tokens_proved_with_right_model_rejected(world: World) -> None:
    """Tokens the model would (almost) never sample, with hidden states and logprobs from the right model."""
    p = world.mine(indices=(26, 27))
    groups = []
    for g in p.batch.groups:
        prompt = g.prompt_ids.tolist()
        comp: list[int] = []
        with torch.no_grad():
            for _ in range(6):  # at each step the least likely token (never a special)
                logits = world.model(input_ids=torch.tensor([prompt + comp])).logits[0, -1].float()
                comp.append(int(torch.argmin(logits[3:])) + 3)
        samples = []
        for _ in g.rollouts:
            lp, h = teacher_forced(world.model, prompt, comp)
            samples.append(Sample(prompt, comp, lp.tolist(), h))
        problem = world.task.problem(derive_seed(MH, MINER, g.index))
        rewards = [world.task.reward(problem, world.tok.decode(s.completion_ids)) for s in samples]
        groups.append((g.index, prompt, samples, rewards))
    q = announce(build_batch(VERSION, MH, MINER, groups))
    verdict = world.validator().check(q.announcement, MINER, q.blob, VERSION)
    # each rollout's tokens also miss their uniforms: the first one recomputed is a hard ``sampling``
    assert _reasons(verdict) <= {R.DISTRIBUTION_BATCH, R.SAMPLING, R.NOT_CHECKED}
    assert _reasons(verdict) & {R.DISTRIBUTION_BATCH, R.SAMPLING} and verdict.hard_failure


def test_prompt_not_derived_from_miner_key_rejected(world: World) -> None:
    p = world.mine(indices=(28, 29))
    b = copy.deepcopy(p.batch)
    b.groups[0].index = 1000  # claims another index: its derived prompt differs
    q = announce(b)
    verdict = world.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.groups[0].reason == R.PROMPT_MISMATCH


def test_batch_resigned_under_another_key_rejected(world: World) -> None:
    p = world.mine(indices=(30, 31))
    v = world.validator()
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION)) == {R.OK}
    # the same blob announced by another miner: the header names the first miner
    assert _reasons(v.check(p.announcement, OTHER_MINER, p.blob, VERSION)) == {R.HEADER_MISMATCH}
    # re-encoded under the other key: the prompts were derived from the first miner's key
    b = copy.deepcopy(p.batch)
    b.miner = OTHER_MINER
    q = announce(b)
    assert R.PROMPT_MISMATCH in _reasons(v.check(q.announcement, OTHER_MINER, q.blob, VERSION))



def _copy_accepted_batch(
    world: World, indices: tuple[int, ...]
) -> tuple[Any, V.RolloutValidator, V.BatchVerdict]:
    """MINER's batch accepted, then its rollouts re-sent by OTHER_MINER on the indices (under its own
    key) whose derived problems are the same: returns MINER's batch, the validator, the copy's verdict."""
    p = world.mine(indices=indices)
    v = world.validator()
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION)) == {R.OK}
    b = copy.deepcopy(p.batch)
    b.miner = OTHER_MINER
    for g in b.groups:
        g.index = retarget(world, g.index, OTHER_MINER)
    q = announce(b)
    return p, v, v.check(q.announcement, OTHER_MINER, q.blob, VERSION)


def test_copied_rollouts_detected_by_seen_index(world: World) -> None:
    p, v, verdict = _copy_accepted_batch(world, (32, 33))
    assert R.COPIED in _reasons(verdict) and verdict.hard_failure
    # and the same miner resubmitting its own prompt slots
    r = announce(copy.deepcopy(p.batch))
    assert _reasons(v.check(r.announcement, MINER, r.blob + b"", VERSION)) == {R.DUPLICATE_INDEX}


def test_version_checks(world: World) -> None:
    p = world.mine(indices=(34, 35))
    v = world.validator()
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION + 3)) == {R.STALE}
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION - 1)) == {R.FUTURE_VERSION}
    other_version = dataclasses.replace(p.announcement, version=VERSION - 1)
    assert _reasons(v.check(other_version, MINER, p.blob, VERSION)) == {R.UNKNOWN_VERSION}
    wrong_hash = dataclasses.replace(p.announcement, manifest_hash="cd" * 32)
    verdict = v.check(wrong_hash, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.MANIFEST_MISMATCH} and not verdict.hard_failure


def test_blob_and_header_checks(world: World) -> None:
    p = world.mine(indices=(36, 37))
    v = world.validator()
    assert _reasons(v.check(p.announcement, MINER, p.blob[:-1] + b"\x00", VERSION)) == {R.BLOB_MISMATCH}
    bad_root = dataclasses.replace(p.announcement, commitment_root="00" * 32)
    assert _reasons(v.check(bad_root, MINER, p.blob, VERSION)) == {R.COMMITMENT_MISMATCH}
    bad_count = dataclasses.replace(p.announcement, groups=3)
    assert _reasons(v.check(bad_count, MINER, p.blob, VERSION)) == {R.GROUP_COUNT}
    junk = b"P2RB\x01not zstd"
    junk_ann = dataclasses.replace(p.announcement, blob=blob_ref_for(junk))
    verdict = v.check(junk_ann, MINER, junk, VERSION)
    assert _reasons(verdict) == {R.BATCH_MALFORMED} and verdict.hard_failure


def test_size_checks(world: World) -> None:
    p = world.mine(indices=(38, 39))
    b = copy.deepcopy(p.batch)
    b.groups[1].index = b.groups[0].index
    q = announce(b)
    assert R.DUPLICATE_INDEX in _reasons(world.validator().check(q.announcement, MINER, q.blob, VERSION))
    b = copy.deepcopy(p.batch)
    b.groups[0].rollouts.pop()
    q = announce(b)
    assert world.validator().check(q.announcement, MINER, q.blob, VERSION).groups[0].reason == R.GROUP_SIZE
    b = copy.deepcopy(p.batch)
    r = b.groups[0].rollouts[0]
    r.completion_ids = np.array([5, world.tok.eos_id, 5], dtype=np.uint32)  # text after eos
    r.logprobs = np.zeros(3, dtype=np.float32)
    r.sketches = np.zeros((3, b.sketch_dim), dtype=np.uint8)
    q = announce(b)
    assert world.validator().check(q.announcement, MINER, q.blob, VERSION).groups[0].reason == R.LENGTH


def test_verdict_message_round_trips(world: World) -> None:
    p = world.mine(indices=(40, 41))
    bv = world.validator().check(p.announcement, MINER, p.blob, VERSION)
    msg = replace(to_verdict(bv, p.announcement, MINER), announcement="ab" * 32)  # the node binds the envelope
    again = Verdict.from_body(msg.to_body())
    assert again.accepted == 2 and again.miner == MINER.hex() and again.blob_id == p.announcement.blob.id


def test_fisher_combination() -> None:
    assert fisher_log_pvalue(np.array([])) == 0.0
    assert fisher_log_pvalue(np.log(np.array([1.0, 1.0]))) == 0.0
    # one token: the p-value is the tail probability itself
    assert fisher_log_pvalue(np.log(np.array([1e-3]))) == pytest.approx(np.log(1e-3))
    # uniform tails are not suspicious; many small ones are
    assert fisher_log_pvalue(np.log(np.full(20, 0.5))) > np.log(0.01)
    assert fisher_log_pvalue(np.log(np.full(20, 1e-2))) < np.log(1e-6)


def _sampled_world(world: World, k: int) -> World:
    return dataclasses.replace(world, config=dataclasses.replace(world.config, checked_per_group=k, checked_tokens=0))


def test_sampling_recomputes_only_the_picked_rollouts(world: World) -> None:
    """With ``checked_per_group`` = 1 the validator runs the model on one rollout per group, picked from
    its secret after receipt: a lie there is caught, a lie elsewhere is not (the cheap checks still
    cover every rollout), and the forward pass shrinks accordingly."""
    w = _sampled_world(world, 1)
    p = world.mine(indices=(50, 51, 52))
    secret = b"s" * 32
    v = w.validator(position_secret=secret)
    honest = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(honest) == {R.OK} and honest.stats.rollouts_recomputed == 3
    picked = [v._sampled(p.announcement.blob.id, gi, GROUP) for gi in range(3)]
    assert all(len(s) == 1 for s in picked)

    # a lie in rollout 0 of group 0 only: caught exactly when the validator picked that rollout for
    # this blob (the picks depend on the blob id, so they are read after the lie is made)
    outcomes = []
    for j in range(40):
        b = copy.deepcopy(p.batch)
        b.groups[0].rollouts[0].logprobs = b.groups[0].rollouts[0].logprobs - 0.5 - 0.01 * j
        q = announce(b)
        v = w.validator(position_secret=secret)
        caught = 0 in v._sampled(q.announcement.blob.id, 0, GROUP)
        verdict = v.check(q.announcement, MINER, q.blob, VERSION)
        assert (verdict.groups[0].reason == R.LOGPROB) == caught
        assert verdict.hard_failure == caught
        outcomes.append(caught)
    assert 0 < sum(outcomes) < len(outcomes)  # picked about a quarter of the time
    # a lie in every rollout is always caught
    b = copy.deepcopy(p.batch)
    for g in b.groups:
        for r in g.rollouts:
            r.logprobs = r.logprobs - 0.5
    q = announce(b)
    verdict = w.validator(position_secret=secret).check(q.announcement, MINER, q.blob, VERSION)
    assert _reasons(verdict) - {R.NOT_CHECKED} == {R.LOGPROB} and verdict.hard_failure


def test_sampled_picks_follow_the_validators_secret(world: World) -> None:
    w = _sampled_world(world, 2)
    a, b = (w.validator(position_secret=s) for s in (b"a" * 32, b"b" * 32))
    blob = "ab" * 32
    picks_a = [frozenset(a._sampled(blob, gi, 8)) for gi in range(64)]
    assert picks_a == [frozenset(a._sampled(blob, gi, 8)) for gi in range(64)]  # stable per secret
    assert picks_a != [frozenset(b._sampled(blob, gi, 8)) for gi in range(64)]
    assert all(len(s) == 2 and s <= set(range(8)) for s in picks_a)
    assert len(set(picks_a)) > 10  # not the same pair every time


def test_sampling_still_rejects_whole_forgeries_and_copies(world: World) -> None:
    w = _sampled_world(world, 1)
    p = w.mine(model=world.other, indices=(53, 54))
    verdict = w.validator().check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) - {R.NOT_CHECKED} == {R.FINGERPRINT} and verdict.hard_failure
    # a repeat is recomputed whether or not it was picked, so a copy is still told from a likely draw
    _, _, verdict = _copy_accepted_batch(w, (55, 56))
    assert R.COPIED in _reasons(verdict) and verdict.hard_failure
    assert verdict.stats.rollouts_picked == 2 * GROUP  # every rollout repeats a seen one


def _sized(world: World, **kw: Any) -> World:
    """The genesis batch shape enforced: 2 groups of GROUP rollouts, indices contiguous from 0."""
    gen = dataclasses.replace(world.config.generation, groups_per_batch=2)
    cfg = dataclasses.replace(world.config, generation=gen, fixed_group_count=True, contiguous_indices=True, **kw)
    return dataclasses.replace(world, config=cfg)


class _Forwards:
    """Counts the validator's forward passes (and the rows they carry) on the real model."""

    def __init__(self, model: Any) -> None:
        self.calls = self.rows = 0
        self._h = model.base_model.register_forward_hook(self._hook)

    def _hook(self, _m: Any, _args: Any, out: Any) -> None:
        self.calls += 1
        self.rows += int(out.last_hidden_state.shape[0])

    def __enter__(self) -> _Forwards:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._h.remove()


def test_a_validator_built_from_the_genesis_holds_batches_to_its_rules(world: World) -> None:
    """``from_genesis`` takes the batch shape, completion length, sampling and staleness bound from the
    genesis itself: an honest batch of its shape passes, another group count or an older version not."""
    g = next(e.message for e in examples() if isinstance(e.message, Genesis))
    gen = dataclasses.replace(world.config.generation, groups_per_batch=2)
    g = dataclasses.replace(g, generation=gen, max_staleness=1)
    cfg = ValidatorConfig.from_genesis(g, checked_per_group=0, contiguous_indices=False)
    assert (cfg.generation, cfg.max_staleness, cfg.fixed_group_count) == (gen, 1, True)
    v = dataclasses.replace(world, config=cfg).validator()
    p = world.mine(indices=(60, 61))
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION)) == {R.OK}
    q = world.mine(indices=(62, 63, 64))
    assert _reasons(v.check(q.announcement, MINER, q.blob, VERSION)) == {R.GROUP_COUNT}
    r = world.mine(indices=(65, 66))
    assert _reasons(v.check(r.announcement, MINER, r.blob, VERSION + 2)) == {R.STALE}


def test_oversized_batch_costs_no_forward_pass(world: World) -> None:
    """Attack (forward amplification): a batch of genuine rollouts, but 8 times the genesis group
    count. Before sizes were enforced the validator recomputed every group of it."""
    w = _sized(world)
    p = world.mine(indices=tuple(range(16)))
    with _Forwards(world.model) as f:
        verdict = w.validator().check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.GROUP_COUNT} and verdict.hard_failure
    assert f.calls == 0
    b = copy.deepcopy(p.batch)  # the right group count, but a group of 3 * GROUP rollouts
    b.groups = b.groups[:2]
    b.groups[0].rollouts += copy.deepcopy(p.batch.groups[2].rollouts + p.batch.groups[3].rollouts)
    q = announce(b)
    with _Forwards(world.model) as f:
        verdict = w.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.hard_failure and f.calls == 0


def test_validation_stops_at_the_first_hard_failure(world: World) -> None:
    """A lie in the cheap checks costs no forward pass; a lie found by the model stops the model work."""
    w = _sized(world, forward_tokens=1)  # one rollout per forward, so the count shows where it stopped
    p = world.mine(indices=(0, 1))
    b = copy.deepcopy(p.batch)
    b.groups[0].rollouts[0].reward = 1.0 - b.groups[0].rollouts[0].reward
    q = announce(b)
    with _Forwards(world.model) as f:
        verdict = w.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.groups[0].reason == R.REWARD and f.calls == 0
    b = copy.deepcopy(p.batch)
    for g in b.groups:
        for r in g.rollouts:
            r.logprobs = r.logprobs - 0.5
    q = announce(b)
    with _Forwards(world.model) as f:
        verdict = w.validator().check(q.announcement, MINER, q.blob, VERSION)
    assert verdict.groups[0].reason == R.LOGPROB and verdict.hard_failure
    assert f.calls == 2, f.calls  # its forward and the float32 second opinion on the rollout that looked off; not 2 * GROUP


def test_cherry_picked_prompt_indices_rejected(world: World) -> None:
    """Attack (cherry-picking): the miner searches its derived prompts for easy ones and publishes only
    those indices. Indices must run from 0, contiguous per (version, miner)."""
    w = _sized(world)
    problems = [world.task.problem(derive_seed(MH, MINER, i)) for i in range(64)]
    answer = [int(pr.answer) for pr in problems]
    easy = min(range(1, 63), key=lambda i: answer[i] + answer[i + 1])  # the smallest sums in a row
    p = world.mine(indices=(easy, easy + 1), seed=3)
    v = w.validator(started_at=VERSION - 1)  # running since before VERSION began
    with _Forwards(world.model) as f:
        verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.INDEX_GAP} and not verdict.valid_groups and f.calls == 0
    assert not verdict.hard_failure  # a lost batch can make an honest miner skip: dropped, no penalty
    first = world.mine(indices=(0, 1))
    assert _reasons(v.check(first.announcement, MINER, first.blob, VERSION)) == {R.OK}
    skip = world.mine(indices=(4, 5))  # skipping the batch at 2, 3
    assert _reasons(v.check(skip.announcement, MINER, skip.blob, VERSION)) == {R.INDEX_GAP}
    gap = world.mine(indices=(2, 4))  # not contiguous inside the batch: an honest miner never does it
    verdict = v.check(gap.announcement, MINER, gap.blob, VERSION)
    assert _reasons(verdict) == {R.INDEX_ORDER} and verdict.hard_failure
    nxt = world.mine(indices=(2, 3))
    assert _reasons(v.check(nxt.announcement, MINER, nxt.blob, VERSION)) == {R.OK}
    # a validator started during VERSION takes a miner's batches of it from the first one it sees
    late = w.validator()
    assert _reasons(late.check(skip.announcement, MINER, skip.blob, VERSION)) == {R.OK}
    # every sample of a group: a group missing one of its GROUP samples (best-of-fewer) is rejected
    b = copy.deepcopy(world.mine(indices=(4, 5)).batch)
    b.groups[1].rollouts.pop()
    q = announce(b)
    assert R.GROUP_SIZE in _reasons(v.check(q.announcement, MINER, q.blob, VERSION))


def test_validator_catching_up_takes_a_version_in_progress_from_its_first_batch(world: World) -> None:
    """A restarted validator still syncing judges batches of a version it does not hold yet as
    ``future_version``; that must not make it expect the miner's batches of that version from index
    0 once it holds it (every later batch would be ``index_gap``: no group accepted, no new version,
    the network stuck until the miner's state is wiped)."""
    w = _sized(world)
    v = w.validator()
    early = world.mine(indices=(4, 5))
    assert _reasons(v.check(early.announcement, MINER, early.blob, VERSION - 1)) == {R.FUTURE_VERSION}
    later = world.mine(indices=(6, 7))  # the miner went on; the validator now holds VERSION
    assert _reasons(v.check(later.announcement, MINER, later.blob, VERSION)) == {R.OK}


def test_check_stats_keep_the_keys_calibration_and_the_benchmark_read() -> None:
    stats = V.CheckStats()
    stats.add_rollout({"fp_rollout": 0.02, "fp_rms": 0.03, "lp_max": 0.1, "dist_logp": -3.0})
    stats.add_rollout({"fp_rollout": 0.01, "lp_max": 0.3, "dist_logp": -1.0})
    assert stats.to_dict() == {
        "fingerprint_err_max": 0.02,
        "fingerprint_rms_max": 0.03,
        "fingerprint_err_group_max": 0.0,
        "fingerprint_err_group_min": 0.0,
        "logprob_err_max": 0.3,
        "distribution_logp_min": -3.0,
        "distribution_batch_logp": 0.0,
        "fingerprint_err_quantile": 0.0,
        "sampling_tokens": 0.0,
        "sampling_misses": 0.0,
        "sampling_dist_max": 0.0,
        "sampling_rung_logp": 0.0,
        "side_positions": 0.0,
        "side_judged": 0.0,
        "side_won": 0.0,
        "side_lost": 0.0,
        "side_logp": 0.0,
        "rollouts_picked": 0.0,
        "rollouts_recomputed": 2.0,
        "rollouts_float32": 0.0,
        "logprob_tail_rollouts": 0.0,
    }


def test_recomputed_rollouts_cover_the_token_target(world: World) -> None:
    """``checked_tokens``: rounds of one more secret pick per group until the completion tokens
    recomputed reach the target (every rollout when they never do)."""
    p = world.mine(indices=(60, 61, 62))
    tokens = [len(r.completion_ids) for g in p.batch.groups for r in g.rollouts]
    for target, want_all in ((0, False), (10**6, True)):
        cfg = dataclasses.replace(world.config, checked_per_group=1, checked_tokens=target)
        v = dataclasses.replace(world, config=cfg).validator()
        got = v.check(p.announcement, MINER, p.blob, VERSION).stats.rollouts_recomputed
        assert got == (len(tokens) if want_all else 3)
    cfg = dataclasses.replace(world.config, checked_per_group=1, checked_tokens=sum(tokens) // 2)
    v = dataclasses.replace(world, config=cfg).validator()
    got = v.check(p.announcement, MINER, p.blob, VERSION).stats.rollouts_recomputed
    assert 3 < got < len(tokens) and got % 3 == 0


def test_a_validator_judging_in_float32_accepts_the_honest_and_catches_other_weights(world: World) -> None:
    """``forward_float32`` (a CPU without bf16 kernels): the bf16 miner's honest batch is accepted
    without a second opinion, and another model's proofs still fail hard."""
    v = world.validator(config=dataclasses.replace(world.config, forward_float32=True))
    p = world.mine(indices=(40, 41), seed=3)
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.OK} and verdict.accepted_rollouts == p.batch.n_rollouts
    assert verdict.stats.rollouts_float32 == 0
    p = world.mine(model=world.other, indices=(42, 43))
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert verdict.groups[0].reason == R.FINGERPRINT and verdict.hard_failure
