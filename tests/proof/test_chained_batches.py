"""Chained batches at the validator (docs/PROTOCOL.md §14): a batch that follows the trainer's
receipt of its key's previous batch is seeded by ``chain_seed(receipts digest, previous blob id)``,
not by anything its key chose; the receipt must be its own key's, each seed serves one batch."""

from __future__ import annotations

import dataclasses
from typing import Any

from proofkit import MINER, OTHER_MINER, VERSION, World

from p2prl.protocol import chain_seed, receipt_id
from p2prl.reasons import HARD_FAILURES
from p2prl.reasons import VerdictReason as R

PREV = "5e" * 32  # the blob id of MINER's previous batch
DIGEST = "d1" * 32  # the envelope digest of the trainer's Receipts that listed it


def _sized(world: World) -> World:
    gen = dataclasses.replace(world.config.generation, groups_per_batch=2)
    cfg = dataclasses.replace(world.config, generation=gen, fixed_group_count=True, contiguous_indices=True)
    return dataclasses.replace(world, config=cfg)


def _lists(**lists: frozenset[str]) -> Any:
    held = {DIGEST: lists.get("entries", frozenset({receipt_id(MINER, PREV)}))}
    return held.get


def _reasons(v: Any) -> set[str]:
    return {g.reason for g in v.groups}


def test_a_chained_batch_is_judged_on_its_chain_seed(world: World) -> None:
    w = _sized(world)
    p = world.mine(indices=(0, 1), chain=(PREV, DIGEST))
    assert p.announcement.chained and p.batch.prompt_seed == chain_seed(DIGEST, PREV)
    v = w.validator(receipts=_lists())
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.OK}
    # the accepted groups carry the seed their uniforms follow (the trainer's token check reads it)
    assert {g.manifest_hash for g in verdict.valid_groups} == {chain_seed(DIGEST, PREV)}
    # a second batch on the same receipt has the same prompts: each seed serves one batch
    again = world.mine(indices=(0, 1), chain=(PREV, DIGEST), seed=9)
    verdict = v.check(again.announcement, MINER, again.blob, VERSION)
    assert _reasons(verdict) == {R.DUPLICATE_INDEX} and verdict.hard_failure


def test_a_receipt_that_is_not_the_keys_own_is_refused_hard(world: World) -> None:
    """A key that claims another key's receipt (or one no list holds) would choose among every seed of
    a list: ``not_receipted``, hard, before any work."""
    w = _sized(world)
    other = world.mine(key=OTHER_MINER, indices=(0, 1), chain=(PREV, DIGEST))  # MINER's receipt
    v = w.validator(receipts=_lists())
    verdict = v.check(other.announcement, OTHER_MINER, other.blob, VERSION)
    assert _reasons(verdict) == {R.NOT_RECEIPTED} and verdict.hard_failure and R.NOT_RECEIPTED in HARD_FAILURES


def test_a_list_not_held_yet_is_soft_and_the_batch_is_judged_once_it_is(world: World) -> None:
    w = _sized(world)
    p = world.mine(indices=(0, 1), chain=(PREV, DIGEST))
    held: dict[str, frozenset[str]] = {}
    v = w.validator(receipts=held.get)
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.UNKNOWN_RECEIPTS} and not verdict.hard_failure
    held[DIGEST] = frozenset({receipt_id(MINER, PREV)})  # the trainer's list arrives
    assert _reasons(v.check(p.announcement, MINER, p.blob, VERSION)) == {R.OK}


def test_a_chained_batch_numbers_its_prompts_from_zero(world: World) -> None:
    """Its seed is its own: prompts 0, 1, … of it, never a pick of later ones (index continuity per
    version applies to chain starts only)."""
    w = _sized(world)
    p = world.mine(indices=(2, 3), chain=(PREV, DIGEST))
    v = w.validator(receipts=_lists())
    verdict = v.check(p.announcement, MINER, p.blob, VERSION)
    assert _reasons(verdict) == {R.INDEX_ORDER} and verdict.hard_failure
    start = world.mine(indices=(0, 1))  # a chain start of the same key: its own numbering
    assert _reasons(v.check(start.announcement, MINER, start.blob, VERSION)) == {R.OK}
