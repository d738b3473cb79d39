"""The trainer's intake driven through the node's network port, in-process: real signed envelopes
through the real gossip checks, a real rollout batch fetched into a real blob store and decoded into
the real replay buffer; no libp2p host, so it runs in a second."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from genesiskit import MODEL
from localnet import LocalHost, LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net.topics import topic
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.intake import RolloutIntake
from p2prl.proof.batch import GroupRecord, RolloutBatch, RolloutRecord, commitment_root, encode_batch
from p2prl.proof.validate import BatchVerdict, GroupVerdict, to_verdict
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.chains import chain_seed
from p2prl.protocol.messages import RolloutAnnouncement, encode_message
from p2prl.reasons import VerdictReason as R
from p2prl.rl.buffer import ReplayBuffer
from p2prl.store import BlobStore

NET = "intake-net"
TRAINER, VALIDATOR, MINER, FORGER = (Identity.generate() for _ in range(4))


class World:
    def __init__(self, tmp: Path) -> None:
        spec = NetworkSpec(network_id=NET, validators=[VALIDATOR.public_hex])
        self.hub = LocalHub(genesis_from_spec(spec, TRAINER, MODEL))
        self.rt = self.hub.runtime("trainer", TRAINER, tmp / "trainer")
        self.miner = self.hub.join(MINER, BlobStore(tmp / "miner"))
        self.validator = self.hub.join(VALIDATOR, BlobStore(tmp / "validator"))
        self.forger = self.hub.join(FORGER, BlobStore(tmp / "forger"))
        self.buffer = ReplayBuffer(max_staleness=2)
        self.intake = RolloutIntake(self.rt.env(TrainerSettings), self.buffer, threading.Lock(), lambda: 0)

    def announce(self, seed: int, prev: str = "", receipts: str = "") -> tuple[RolloutAnnouncement, str]:
        """A two-group batch served by the miner, announced (``prev``, ``receipts``: chained on the
        trainer's receipt of ``prev``); (announcement, envelope digest)."""
        rng = np.random.default_rng(seed)
        groups = [
            GroupRecord(
                index=i,
                prompt_ids=rng.integers(3, 99, 6).astype(np.uint32),
                rollouts=[
                    RolloutRecord(
                        completion_ids=rng.integers(0, 99, 4).astype(np.uint32),
                        logprobs=-rng.random(4).astype(np.float32),
                        reward=float(r),
                        sketches=rng.integers(0, 256, (4, 16)).astype(np.uint8),
                    )
                    for r in (0, 1)
                ],
            )
            for i in range(2)
        ]
        batch = RolloutBatch(version=0, manifest_hash="ef" * 32, miner=MINER.public_key, groups=groups)
        data = encode_batch(batch)
        ref = blob_ref_for(data, 64 * 1024)
        self.miner.store.put(data)
        self.miner.serve(ref)
        ann = RolloutAnnouncement(0, "ef" * 32, ref, 2, commitment_root(batch), prev=prev, receipts=receipts)
        raw = encode_message(MINER, NET, ann)
        self.miner.publish(topic(NET, "rollouts"), raw)
        return ann, hashlib.sha256(raw).hexdigest()

    def judge(self, host: LocalHost, signer: Identity, ann: RolloutAnnouncement, digest: str, *reasons: str) -> None:
        bv = BatchVerdict([GroupVerdict(i, r == R.OK, r) for i, r in enumerate(reasons)], [], R.FINGERPRINT in reasons)
        v = replace(to_verdict(bv, ann, MINER.public_key), announcement=digest)
        host.publish(topic(NET, "verdicts"), encode_message(signer, NET, v))

    def receipts(self) -> str:
        """The trainer's next receipts list, as its receipts loop sends it: its envelope digest."""
        raw = self.intake.receipts.take()
        assert raw is not None
        return hashlib.sha256(raw).hexdigest()

    def chained(self, seed: int) -> tuple[RolloutAnnouncement, str]:
        """A chain start accepted, then the batch that follows its receipt: (announcement, digest)."""
        start, digest = self.announce(seed + 1000)
        self.judge(self.validator, VALIDATOR, start, digest, R.OK, R.OK)
        self.pump()
        return self.announce(seed, prev=start.blob.id, receipts=self.receipts())

    def pump(self) -> None:
        """What the node's pump does with the trainer's handlers."""
        handlers = {"rollout_announcement": self.intake.on_announcement, "verdict": self.intake.on_verdict}
        for item in self.rt.net.poll(timeout=0.1):
            handlers[item.envelope.type](item)

    def consume(self, timeout: float = 10.0) -> None:
        """Run one fetch thread until the buffer has something (or ``timeout``)."""
        self.rt.spawn("fetch", self.intake.run)
        deadline = time.monotonic() + timeout
        while not len(self.buffer) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.rt.stop.set()
        self.rt.join(5)


def test_accepted_groups_reach_the_buffer_and_forged_verdicts_do_not(tmp_path: Path) -> None:
    w = World(tmp_path)
    ann, digest = w.chained(seed=1)
    w.judge(w.forger, FORGER, ann, digest, R.OK, R.OK)  # a key that is no genesis validator accepts both
    w.judge(w.validator, VALIDATOR, ann, digest, R.OK, R.STALE)  # the validator accepts group 0 only
    w.pump()
    assert w.rt.net.stats().get("dropped.unknown_signer") == 1  # the forger's verdict never arrived
    w.consume()
    assert len(w.buffer) == 1
    (group,) = w.buffer.sample(0, 1)
    assert group.miner == MINER.public_hex and [r.reward for r in group.rollouts] == [0.0, 1.0]
    assert group.manifest_hash == chain_seed(ann.receipts, ann.prev)  # its uniforms' seed, for the token check
    snap = w.rt.status.snapshot()
    counters = snap["counters"]
    assert counters["groups_consumed"] == 1 and counters["verdicts_received"] == 2
    assert snap["labelled"]["dropped"]["chain_start"] == 2  # the batch it follows: trained by nobody
    assert w.rt.store.has(ann.blob.id)  # fetched through the port into the trainer's store


def test_a_hard_failure_vetoes_the_blob(tmp_path: Path) -> None:
    w = World(tmp_path)
    ann, digest = w.announce(seed=2)
    w.judge(w.validator, VALIDATOR, ann, digest, R.OK, R.FINGERPRINT)
    w.pump()
    assert w.intake.fetch_q.empty()
    w.consume(timeout=1.0)
    assert len(w.buffer) == 0 and not w.rt.store.has(ann.blob.id)
    assert w.rt.status.snapshot()["counters"]["verdict_vetoes"] == 1


def test_a_hard_failure_costs_the_key_its_training_share(tmp_path: Path) -> None:
    """A veto bars the key, not only the blob: its groups already buffered leave, and a later blob
    that every validator accepted is not used (a score the trainer never reads is no deterrent)."""
    from p2prl.rl.types import Rollout, RolloutGroup

    w = World(tmp_path)
    for miner in (MINER.public_hex, FORGER.public_hex):
        w.buffer.add(RolloutGroup([5, 6], [Rollout([7], [-1.0], 0.0), Rollout([8], [-1.0], 1.0)], 0, miner))
    ann, digest = w.announce(seed=3)
    w.judge(w.validator, VALIDATOR, ann, digest, R.OK, R.FINGERPRINT)
    w.pump()
    assert [g.miner for g in w.buffer.sample(0, 8, consume=False)] == [FORGER.public_hex]
    ann, digest = w.chained(seed=4)
    w.judge(w.validator, VALIDATOR, ann, digest, R.OK, R.OK)
    w.pump()
    w.consume(timeout=2.0)
    assert [g.miner for g in w.buffer.sample(0, 8, consume=False)] == [FORGER.public_hex]
    snap = w.rt.status.snapshot()
    assert snap["labelled"]["keys_barred"] == {"verdict_veto": 1}
    assert snap["labelled"]["dropped"]["barred_rollouts"] == 3  # one buffered group, two of the later blob


def test_a_batch_is_trained_only_on_its_own_receipt_of_an_accepted_batch(tmp_path: Path) -> None:
    """Key grinding's cost: a chain start is trained by nobody, and so is a batch that follows a
    batch no validator accepted (the chain must be rebuilt by a batch of work), one that names a list
    other than the one that receipted its predecessor, and a second batch on one receipt."""
    w = World(tmp_path)
    refused, digest = w.announce(seed=20)
    w.judge(w.validator, VALIDATOR, refused, digest, R.STALE, R.STALE)
    w.pump()
    after_refused, d1 = w.announce(seed=21, prev=refused.blob.id, receipts=w.receipts())
    w.judge(w.validator, VALIDATOR, after_refused, d1, R.OK, R.OK)
    start, d2 = w.announce(seed=22)
    w.judge(w.validator, VALIDATOR, start, d2, R.OK, R.OK)
    w.pump()
    listed = w.receipts()
    wrong_list, d3 = w.announce(seed=23, prev=start.blob.id, receipts="00" * 32)
    good, d4 = w.announce(seed=24, prev=start.blob.id, receipts=listed)
    again, d5 = w.announce(seed=25, prev=start.blob.id, receipts=listed)
    for ann, d in ((wrong_list, d3), (good, d4), (again, d5)):
        w.judge(w.validator, VALIDATOR, ann, d, R.OK, R.OK)
    w.pump()
    w.consume(timeout=3.0)
    time.sleep(0.5)
    assert {g.manifest_hash for g in w.buffer.sample(0, 8, consume=False)} == {chain_seed(listed, start.blob.id)}
    dropped = w.rt.status.snapshot()["labelled"]["dropped"]
    assert dropped["chain_start"] == 2 and dropped["unchained"] == 2 + 2 + 2  # after the refused, wrong list, again


def test_a_restarted_trainer_trains_the_batch_that_follows_its_receipt_from_before(tmp_path: Path) -> None:
    """A trainer's restart costs no miner a batch of work: the receipt it sent and the decision on
    the batch it receipted are kept (``chains.jsonl``), so the miner's next batch on that receipt is
    trained after the restart; a receipt used before a restart seeds nothing after it, and a barred
    key stays barred."""
    w = World(tmp_path)

    def restart() -> None:  # a new intake on the trainer's directory: nothing carried in memory
        w.intake = RolloutIntake(w.rt.env(TrainerSettings), w.buffer, threading.Lock(), lambda: 0)

    start, d0 = w.announce(seed=31)
    w.judge(w.validator, VALIDATOR, start, d0, R.OK, R.OK)
    w.pump()
    listed = w.receipts()
    restart()
    good, d1 = w.announce(seed=32, prev=start.blob.id, receipts=listed)
    w.judge(w.validator, VALIDATOR, good, d1, R.OK, R.OK)
    w.pump()
    w.consume(timeout=5.0)
    assert {g.manifest_hash for g in w.buffer.sample(0, 8, consume=False)} == {chain_seed(listed, start.blob.id)}
    assert len(w.buffer) == 2

    w.rt.stop.clear()
    restart()
    again, d2 = w.announce(seed=33, prev=start.blob.id, receipts=listed)  # the receipt, used before
    w.judge(w.validator, VALIDATOR, again, d2, R.OK, R.OK)
    w.pump()
    vetoed, d3 = w.announce(seed=34)
    w.judge(w.validator, VALIDATOR, vetoed, d3, R.OK, R.FINGERPRINT)
    w.pump()
    w.consume(timeout=1.0)
    assert len(w.buffer) == 0  # the veto's bar took the miner's buffered groups
    assert w.rt.status.snapshot()["labelled"]["dropped"]["unchained"] == 2
    restart()
    assert w.intake.is_barred(MINER.public_hex) and w.intake.policy.vetoed(MINER.public_hex, vetoed.blob.id)
    assert w.intake.policy.accepted(MINER.public_hex, good.blob.id)
