"""A miner pays only for what it provably caused: a batch the validator could not fetch or read
costs that batch, not the miner's later ones, and a blob server that pauses for seconds costs none.

Real hosts (``p2prl.bench.arena``): the validator fetches over libp2p from the miner host.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
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


def test_a_batch_that_arrives_before_the_one_it_follows_is_held_for_it(arena: Arena) -> None:
    """Gossip brought a miner's later batch before its earlier one (a loaded demo lost both: the later
    ``index_gap``, the earlier ``stale`` by the time it came): the later one waits for the earlier,
    and both are accepted."""
    miner = Identity.generate()
    v = arena.validator
    _, first = judge(arena, miner)
    assert accepted(first) == len(first.groups)
    _, early = arena.mine(miner)
    _, late = arena.mine(miner)
    before = v.env.status.snapshot()["counters"].get("groups_accepted", 0)
    assert v.check(arena.announce(miner, late)) is None  # held, no verdict yet
    bv = v.check(arena.announce(miner, early))
    assert accepted(bv) == len(bv.groups), reasons(bv)
    after = v.env.status.snapshot()["counters"].get("groups_accepted", 0)
    assert after - before == early.groups + late.groups  # the held one judged after it
    assert not v._held


def test_a_skipped_batch_is_still_a_gap_when_the_wait_ends(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A miner that never announces a batch (it skipped it) gets the next one ``index_gap`` once the
    wait is over: the hold bridges reordering, not skipping."""
    miner = Identity.generate()
    v = arena.validator
    _, first = judge(arena, miner)
    assert accepted(first) == len(first.groups)
    arena.mine(miner, serve=False)  # mined, never announced
    _, after = arena.mine(miner)
    monkeypatch.setattr(vmod, "REORDER_HOLD_S", 0.0)
    bv = v.check(arena.announce(miner, after))
    if bv is None:  # held until the wait ends
        released = v._release_held()
        assert len(released) == 1
        bv = released[0]
    assert reasons(bv) == {VerdictReason.INDEX_GAP}
    assert not v._held


def test_a_batch_announced_in_time_is_judged_though_the_validator_fell_behind(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staleness is the miner's lateness: a batch that arrived while its version was current is judged
    (and scored) though judging here lagged past the window before reaching it; one that arrived
    late is ``stale``. Before, a loaded demo's validator answered 3.7% of honest groups ``stale``
    because its own fetches and judging lagged."""
    miner = Identity.generate()
    v = arena.validator
    _, ann = arena.mine(miner)
    item = arena.announce(miner, ann)
    v.on_announcement(item)  # arrives at the batch's own version
    assert v._next() is item
    behind = dataclasses.replace(v.current, version=v.current.version + v.max_staleness + 2)
    monkeypatch.setattr(v.host, "_current", behind)  # judging lagged: the network moved on meanwhile
    monkeypatch.setattr(v, "_timeline", vmod.deque([(time.time() - 60, 0), (time.time() - 1, behind.version)]))
    bv = v.check(item)
    assert accepted(bv) == len(bv.groups), reasons(bv)
    _, ann = arena.mine(miner)
    late = arena.announce(miner, ann)
    v.on_announcement(late)  # arrives when its version is out of the window: the miner was late
    assert v._next() is late
    assert reasons(v.check(late)) == {VerdictReason.STALE}


def test_a_batch_whose_weights_went_out_of_reach_is_stale_not_unknown(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validator that synced through an anchor can no longer step back to the versions before it:
    a batch of one of them, announced in time, is ``stale`` (the validator's reach), not
    ``unknown_version`` (a loaded demo's validator answered 224 honest groups so)."""
    miner = Identity.generate()
    v = arena.validator
    _, ann = arena.mine(miner)
    item = arena.announce(miner, ann)
    v.on_announcement(item)
    assert v._next() is item
    monkeypatch.setattr(v.host, "_current", dataclasses.replace(v.current, version=v.current.version + 2))
    monkeypatch.setattr(v.host, "can_load", lambda version: version != ann.version)
    assert reasons(v.check(item)) == {VerdictReason.STALE}


def test_staleness_counts_from_the_signed_creation_time_within_the_gossip_allowance(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An announcement gossip held back (a dead connection, 12 s in a loaded demo) is judged as of the
    version this validator held when the miner signed it; a claim of more than ``GOSSIP_DELAY_S``
    before arrival is not believed, so a miner cannot backdate a stale batch into the window."""
    miner = Identity.generate()
    v = arena.validator
    now = time.time()
    v0 = v.current.version
    ahead = v0 + v.max_staleness + 2
    monkeypatch.setattr(v, "_timeline", vmod.deque([(now - 60, v0), (now - 5, ahead)]))
    monkeypatch.setattr(v.host, "_current", dataclasses.replace(v.current, version=ahead))
    _, ann = arena.mine(miner)
    held_back = arena.announce(miner, dataclasses.replace(ann, created_ms=int((now - 12) * 1000)))
    v.on_announcement(held_back)  # signed 12 s ago, when v0 was current: in time
    assert v._next() is held_back
    bv = v.check(held_back)
    assert accepted(bv) == len(bv.groups), reasons(bv)
    _, ann = arena.mine(miner)
    backdated = arena.announce(miner, dataclasses.replace(ann, created_ms=int((now - 600) * 1000)))
    monkeypatch.setattr(v, "_timeline", vmod.deque([(now - 900, v0), (now - 30, ahead)]))
    v.on_announcement(backdated)  # claims 10 minutes ago: believed back to 20 s only, when v0 was old
    assert v._next() is backdated
    assert reasons(v.check(backdated)) == {VerdictReason.STALE}
