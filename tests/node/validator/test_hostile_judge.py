"""Attacks on the validator's judging and the trainer's intake by keys without compute.

Each test performs the attack with real signed envelopes against the real Trainer and Validator on
real hosts (``p2prl.bench.arena.Arena``) and checks that honest work still counts. The arena is shared by the
module; the score wipe runs last, as on an unprotected validator it would zero every later check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Iterator

import pytest

from p2prl.bench.arena import Arena, delivered, judge_all, make_arena, verdicts_at_trainer
from p2prl.crypto.keys import Identity
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.messages import MAX_VERSION, RolloutAnnouncement


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory, model_cache) -> Iterator[Arena]:
    a = make_arena(tmp_path_factory.mktemp("arena"), model_cache)
    yield a
    a.close()


_seeds: Iterator[bytes] = iter(())


@pytest.fixture(autouse=True)
def _fixed_keys(request: pytest.FixtureRequest) -> None:
    """Each test's keys from its own name: the rollouts, and so the verdicts, are the same every run."""
    global _seeds
    _seeds = (hashlib.sha256(f"{request.node.name}/{i}".encode()).digest() for i in itertools.count())


def _key() -> Identity:
    return Identity(next(_seeds))


def accepted(bv) -> int:
    return sum(1 for g in bv.groups if g.accepted)


def queued(trainer) -> list[tuple]:
    """What the trainer has released for fetching (drained)."""
    out = []
    while not trainer.fetch_q.empty():
        out.append(trainer.fetch_q.get_nowait())
    return out


def score(v, miner: Identity) -> int:
    return v.scores.scores(v.current.version).get(miner.public_hex, 0)


def test_blob_id_squatting(arena: Arena) -> None:
    """Item 1: a key re-announces an honest miner's blob id first. The honest batch is still judged
    by every validator, and the trainer still takes it on their verdicts."""
    honest, squatter = _key(), _key()
    _, ann = arena.mine(honest)
    theirs = arena.announce(squatter, dataclasses.replace(ann, created_ms=ann.created_ms + 1))
    mine = arena.announce(honest, ann)
    t = arena.trainer.intake
    t.on_announcement(mine)
    t.on_announcement(theirs)  # at the trainer the squatter's copy arrives last
    for v in arena.validators:
        v.on_announcement(theirs)  # at the validators it arrives first
        v.on_announcement(mine)
        verdicts = [bv for bv in judge_all(v) if bv is not None]
        assert [accepted(bv) for bv in verdicts] == [0, ann.groups], "the honest batch was not judged"
        assert score(v, honest) > 0 and score(v, squatter) == 0
    for item in verdicts_at_trainer(arena, 4, honest, squatter):  # the squatter's: hard failures
        t.on_verdict(item)
    jobs = queued(t)
    assert [(j[1], j[0].blob.id) for j in jobs] == [(honest.public_hex, ann.blob.id)]


def test_forced_rejudgement(arena: Arena) -> None:
    """Item 10: flooding the judged-blob memory must not get an old honest batch judged again
    (it would fail as a duplicate and zero the miner). The memory is shrunk to 32 entries so the
    flood is 33 batches, not thousands."""
    import p2prl.node.validator.validator as vmod

    honest, flooder = _key(), _key()
    v = arena.validator
    _, ann = arena.mine(honest)
    v.check(arena.announce(honest, ann))
    assert score(v, honest) > 0
    if hasattr(vmod, "CHECKED_BLOBS"):
        vmod.CHECKED_BLOBS, old = 32, vmod.CHECKED_BLOBS
    else:
        v.jq.judged.capacity, old = 32, v.jq.judged.capacity
    try:
        for _ in range(33):
            junk = os.urandom(200)
            ref = blob_ref_for(junk, chunk_size=64 * 1024)
            v.env.store.put(junk, expected_id=ref.id)
            v.check(arena.announce(flooder, dataclasses.replace(ann, blob=ref)))
        replay = arena.announce(honest, dataclasses.replace(ann, created_ms=ann.created_ms + 7))
        v.on_announcement(replay)
        judge_all(v)
    finally:
        if hasattr(vmod, "CHECKED_BLOBS"):
            vmod.CHECKED_BLOBS = old
        else:
            v.jq.judged.capacity = old
    assert score(v, honest) > 0, "the honest miner was zeroed by a re-judgement"


def test_forced_rejudgement_many_keys(arena: Arena) -> None:
    """Item 25: the same flood with a fresh key per junk batch (one judged batch each) must not make
    the honest miner's pair the one forgotten. The memory is shrunk to 64 entries."""
    honest = _key()
    v = arena.validator
    _, ann = arena.mine(honest)
    v.check(arena.announce(honest, ann))
    before = score(v, honest)
    assert before > 0
    v.jq.judged.capacity, old = 64, v.jq.judged.capacity
    try:
        for _ in range(65):
            junk = os.urandom(200)
            ref = blob_ref_for(junk, chunk_size=64 * 1024)
            v.env.store.put(junk, expected_id=ref.id)
            v.check(arena.announce(_key(), dataclasses.replace(ann, blob=ref)))
        replay = arena.announce(honest, dataclasses.replace(ann, created_ms=ann.created_ms + 9))
        v.on_announcement(replay)
        judge_all(v)
    finally:
        v.jq.judged.capacity = old
    assert score(v, honest) == before, "the honest miner was zeroed by a re-judgement"


def test_hard_failure_vetoes(arena: Arena) -> None:
    """Item 9: one validator accepts, the other finds a hard failure: the trainer must not train on it."""
    miner = _key()
    t, v1 = arena.trainer.intake, arena.validators[0]
    _, ann = arena.mine(miner)
    item = arena.announce(miner, ann)
    t.on_announcement(item)
    v1.check(item)
    (accepting,) = verdicts_at_trainer(arena, 1, miner)
    assert accepting.message.accepted == ann.groups
    groups = accepting.message.groups
    hard = tuple(dataclasses.replace(g, accepted=False, reason="fingerprint") for g in groups)
    veto = delivered(arena.ids["validator1"], dataclasses.replace(accepting.message, groups=hard))
    t.on_verdict(accepting)
    t.on_verdict(veto)
    time.sleep(0.1)
    assert queued(t) == [], "a blob another genesis validator proved bad was queued for training"


def test_announcement_cache_flood(arena: Arena) -> None:
    """Item 12: junk announcements from one key and from many keys must not evict an honest
    miner's announcement before its verdicts arrive."""
    honest, flooder = _key(), _key()
    t = arena.trainer.intake
    _, first = arena.mine(honest)  # the miner's earlier batch, accepted and used
    it = arena.announce(honest, first)
    t.on_announcement(it)
    for v in arena.validators:
        v.check(it)
    for i in verdicts_at_trainer(arena, 2, honest):
        t.on_verdict(i)
    assert len(queued(t)) == 1
    _, ann = arena.mine(honest)
    it = arena.announce(honest, ann)
    t.on_announcement(it)
    for v in arena.validators:
        v.check(it)
    verdicts = verdicts_at_trainer(arena, 2, honest)
    sybils = [flooder] * 1100 + [_key() for _ in range(1000)]  # 2,100 > the old cache
    for n, key in enumerate(sybils):
        junk = RolloutAnnouncement(
            version=0,
            manifest_hash=ann.manifest_hash,
            blob=blob_ref_for(n.to_bytes(8, "big"), chunk_size=64 * 1024),
            groups=1,
            commitment_root=ann.commitment_root,
        )
        t.on_announcement(delivered(key, junk))
    for i in verdicts:
        t.on_verdict(i)
    jobs = queued(t)
    assert [(j[1], j[0].blob.id) for j in jobs] == [(honest.public_hex, ann.blob.id)]


def test_scores_message_bounded(arena: Arena) -> None:
    """Item 11: with 3,000 scored miners every score still reaches the network (the message was
    once refused as oversized past about 1,900 miners, so every later publish failed)."""
    from p2prl.protocol.messages import Scores

    v = arena.validators[1]
    miners = {f"{i:064x}": 1 + i % 7 for i in range(3000)}
    for m, n in miners.items():
        v.scores.record(m, 0, n)
    failed = lambda: sum(v.env.status.snapshot()["labelled"].get("publish_failed", {}).values())  # noqa: E731
    before = failed()
    v._last_scores = 0.0
    v._maybe_publish_scores()
    assert failed() == before, "the scores could not be published"
    got: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while not miners.items() <= got.items() and time.monotonic() < deadline:
        for i in arena.trainer_rt.net.poll(timeout=0.5):
            if i.envelope.type == Scores.TYPE and i.envelope.signer_hex == v.env.identity.public_hex:
                got.update(i.message.scores)
    assert miners.items() <= got.items()


@pytest.mark.slow
def test_validator_stall(arena: Arena) -> None:
    """Item 4: announcements of blobs nobody serves, from many keys, must not hold up an honest
    miner's next batch (the judging thread runs as in a node)."""
    honest = _key()
    v = arena.validator
    _, first = arena.mine(honest)
    v.on_announcement(arena.announce(honest, first))
    judge_all(v)
    assert score(v, honest) > 0
    for _ in range(6):  # six keys, each announcing a blob nobody holds
        junk = os.urandom(2000)
        fake = dataclasses.replace(first, blob=blob_ref_for(junk, chunk_size=64 * 1024))
        v.on_announcement(arena.announce(_key(), fake))
    _, second = arena.mine(honest)
    before = v.env.status.counter("groups_accepted")
    v.on_announcement(arena.announce(honest, second))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            item = v._next()
            if item is not None:
                v.check(item)

    th = threading.Thread(target=loop, daemon=True)
    t0 = time.monotonic()
    th.start()
    try:
        while v.env.status.counter("groups_accepted") == before and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        stop.set()
        th.join(60)
    assert v.env.status.counter("groups_accepted") > before, "the honest batch waited behind the flood"
    assert took < 10


def test_score_wipe(arena: Arena) -> None:
    """Item 3: one judged announcement claiming version 2^40 must not zero every miner."""
    honest, wiper = _key(), _key()
    v = arena.validator
    _, ann = arena.mine(honest)
    v.check(arena.announce(honest, ann))
    before = score(v, honest)
    assert before > 0
    junk = os.urandom(1000)
    ref = blob_ref_for(junk, chunk_size=64 * 1024)
    arena.serve(junk, dataclasses.replace(ann, blob=ref))
    far = dataclasses.replace(ann, version=MAX_VERSION, blob=ref)
    v.check(arena.announce(wiper, far))
    assert score(v, honest) == before
    assert v.scores.latest <= v.current.version
