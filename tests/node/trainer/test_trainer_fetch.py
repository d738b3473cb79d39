"""Item 19 of docs/SECURITY.md: a miner that stops serving after validation must not hold up the
trainer's other accepted batches, which it takes from the validators that hold them."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace

import pytest

from p2prl.net import topic
from p2prl.net.node import P2PNode
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.trainer import Trainer
from p2prl.proof.validate import BatchVerdict, GroupVerdict, to_verdict
from p2prl.protocol import encode_message
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.messages import RolloutAnnouncement
from p2prl.reasons import VerdictReason
from p2prl.store import BlobStore


@pytest.mark.slow
def test_stalled_miner_does_not_hold_up_other_batches(make_net, tmp_path) -> None:
    net = make_net()
    rt = build_runtime(net.config("trainer"))
    trainer = Trainer(rt.env(TrainerSettings))
    hosts = []
    try:
        rt.start(trainer)
        for name in ("validator", "miner1"):  # the validator's and the miner's real keys and hosts
            h = P2PNode(net.ids[name], rt.genesis.network_id, BlobStore(tmp_path / f"{name}-host"))
            h.start()
            h.connect(rt.net.addrs[0])
            hosts.append(h)
        validator, miner = hosts
        # A: its miner stopped serving, and no validator kept it. B: the validator holds it.
        blobs = [os.urandom(40_000), os.urandom(40_000)]
        refs = [blob_ref_for(b, 16 * 1024) for b in blobs]
        validator.store.put(blobs[1])
        validator.serve(refs[1])
        # both follow the trainer's receipt of an earlier accepted batch of the miner (else, chain
        # starts, the trainer would fetch neither)
        prev = _receipted(trainer, miner.identity.public_key)
        anns = [RolloutAnnouncement(0, "00" * 32, r, 2, "11" * 32, prev=p, receipts=d) for r, (p, d) in zip(refs, prev, strict=True)]
        accept = BatchVerdict([GroupVerdict(i, True, VerdictReason.OK) for i in range(2)], [], False)
        first_b = None
        deadline = time.monotonic() + 40
        while not rt.store.has(refs[1].id) and time.monotonic() < deadline:
            for ann in anns:  # A first, then B; re-signed each round until the mesh carries them
                raw = encode_message(miner.identity, rt.genesis.network_id, ann)
                miner.publish(topic(rt.genesis.network_id, "rollouts"), raw)
                time.sleep(0.3)
                v = replace(
                    to_verdict(accept, ann, miner.identity.public_key),
                    announcement=hashlib.sha256(raw).hexdigest(),  # the verdict binds this envelope
                )
                validator.publish(
                    topic(rt.genesis.network_id, "verdicts"), encode_message(validator.identity, rt.genesis.network_id, v)
                )
                time.sleep(0.3)
            if first_b is None and rt.status.snapshot()["counters"].get("verdicts_received", 0) >= 2:
                first_b = time.monotonic()
        assert rt.store.has(refs[1].id), "B never fetched"
        assert first_b is not None and time.monotonic() - first_b < 12, "B waited behind A's stalled fetch"
    finally:
        rt.stop.set()
        rt.join(30)
        for h in hosts:
            h.stop()
        rt.net.stop()


def _receipted(trainer: Trainer, miner: bytes) -> list[tuple[str, str]]:
    """Two earlier batches of ``miner``, accepted, then receipted by the trainer's receipts loop:
    (their blob ids, the digest of the list that receipted each)."""
    intake, out = trainer.intake, []
    for _ in range(2):
        prev = os.urandom(32).hex()
        with intake.lock:
            intake.policy.done[(miner.hex(), prev)] = False  # released for training earlier
        before = intake.receipts.recent[-1:]
        intake.receipts.add(miner, prev, trusted=True)
        deadline = time.monotonic() + 10
        while intake.receipts.recent[-1:] == before and time.monotonic() < deadline:
            time.sleep(0.05)
        out.append((prev, hashlib.sha256(intake.receipts.recent[-1]).hexdigest()))
    return out
