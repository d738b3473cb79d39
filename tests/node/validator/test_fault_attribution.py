"""A miner pays only for what it provably caused: a batch the validator could not fetch or read
costs that batch, not the miner's later ones, and a blob server that pauses for seconds costs none.

Real hosts (``p2prl.bench.arena``): the validator fetches over libp2p from the miner host.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator

import pytest

import p2prl.node.validator.validator as vmod
from p2prl.bench.arena import Arena, make_arena
from p2prl.crypto.keys import Identity
from p2prl.protocol.blobs import blob_ref_for
from p2prl.reasons import VerdictReason


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory, model_cache) -> Iterator[Arena]:
    a = make_arena(tmp_path_factory.mktemp("arena"), model_cache, validators=1)
    yield a
    a.close()


def reasons(bv) -> set[str]:
    return {g.reason for g in bv.groups}


def accepted(bv) -> int:
    return sum(1 for g in bv.groups if g.accepted)


def judge(arena: Arena, miner: Identity, serve: bool = True):
    _, ann = arena.mine(miner, serve=serve)
    return ann, arena.validator.check(arena.announce(miner, ann))


def test_unreachable_batch_costs_only_itself(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vmod, "RETRY_BACKOFF_S", (), raising=False)  # one try: the batch stays unfetched
    miner = Identity.generate()
    _, first = judge(arena, miner)
    assert accepted(first) == len(first.groups)
    _, lost = judge(arena, miner, serve=False)  # nobody serves it: unreachable
    assert reasons(lost) == {VerdictReason.UNREACHABLE}
    _, after = judge(arena, miner)
    assert accepted(after) == len(after.groups), reasons(after)  # not index_gap


def test_undecodable_batch_advances_the_index(arena: Arena) -> None:
    """A batch that fails to decode is the miner's fault and rejected hard; its announced groups
    still count as used, so the next batch continues after them."""
    miner = Identity.generate()
    v = arena.validator
    _, first = judge(arena, miner)
    assert accepted(first) == len(first.groups)
    _, ann = arena.mine(miner, serve=False)  # its indices are taken; its blob replaced by junk
    junk = os.urandom(300)
    ref = blob_ref_for(junk, chunk_size=64 * 1024)
    arena.serve(junk, dataclasses.replace(ann, blob=ref))
    bad = v.check(arena.announce(miner, dataclasses.replace(ann, blob=ref)))
    assert accepted(bad) == 0 and VerdictReason.INDEX_GAP not in reasons(bad)
    _, after = judge(arena, miner)
    assert VerdictReason.INDEX_GAP not in reasons(after), reasons(after)
    assert accepted(after) == len(after.groups)


def test_paused_blob_server_costs_no_batch(arena: Arena) -> None:
    """The miner's blob appears 10 s after its announcement (a blob server paused for 10 s, far
    longer than the 3 s probe): a miner in standing is asked again, and its batch is judged."""
    miner = Identity.generate()
    _, first = judge(arena, miner)
    assert accepted(first) == len(first.groups)
    data, ann = arena.mine(miner, serve=False)
    timer = threading.Timer(10.0, arena.serve, (data, ann))
    timer.start()
    try:
        bv = arena.validator.check(arena.announce(miner, ann))
    finally:
        timer.join()
    assert accepted(bv) == len(bv.groups), reasons(bv)


def test_a_new_miners_first_batch_is_asked_for_again(arena: Arena) -> None:
    """An honest miner's first batch, its blob served 5 s late (a busy machine at start-up), is
    judged: with nothing flooding the queue a new key is retried too (before: ``unreachable``)."""
    miner = Identity.generate()
    data, ann = arena.mine(miner, serve=False)
    timer = threading.Timer(5.0, arena.serve, (data, ann))
    timer.start()
    try:
        bv = arena.validator.check(arena.announce(miner, ann))
    finally:
        timer.join()
    assert accepted(bv) == len(bv.groups), reasons(bv)


def test_a_batch_gone_stale_in_the_queue_is_answered_without_a_fetch(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog of batches whose version left the window is answered ``stale`` at once (no probe,
    no strike against the miner), so the queue drains; before, each cost a fetch and, its blob gone,
    an ``unreachable`` strike."""
    miner = Identity.generate()
    v = arena.validator
    _, ann = arena.mine(miner, serve=False)
    monkeypatch.setattr(v, "max_staleness", -1)  # version 0 at version 0: out of the window
    before = v.env.status.snapshot()["labelled"].get("rollout_unfetchable", {})
    bv = v.check(arena.announce(miner, ann))
    assert reasons(bv) == {VerdictReason.STALE}
    assert v.env.status.snapshot()["labelled"].get("rollout_unfetchable", {}) == before
    assert v.jq.standing(miner.public_hex) != 2  # not penalized


def test_batches_shed_over_the_quota_leave_no_gap(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miner announcing faster than the validator judges (its quota full) loses the batches shed,
    not the rest of the version: a shed announcement stays in order as a marker and its indices are
    passed over (before: dropped, and every later batch of the version ``index_gap``)."""
    from p2prl.bench.arena import judge_all

    miner = Identity.generate()
    v = arena.validator
    monkeypatch.setattr(v.jq, "per_signer", 2)
    items = [arena.announce(miner, arena.mine(miner)[1]) for _ in range(3)]
    for item in items:
        v.on_announcement(item)
    verdicts = judge_all(v)
    assert [bv is not None and accepted(bv) == len(bv.groups) for bv in verdicts[:2]] == [True, True]
    assert verdicts[2:] in ([], [None])  # shed: no verdict
    _, after = judge(arena, miner)
    assert accepted(after) == len(after.groups), reasons(after)
