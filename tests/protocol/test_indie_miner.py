"""An independent miner written from docs/PROTOCOL.md alone (tests/protocol/indie/, which imports
nothing from p2prl) mines batches p2prl's validator accepts, and each of its deliberate deviations is
rejected with the reason the spec names."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from p2prl.crypto import Identity
from p2prl.proof import RolloutValidator, ValidatorConfig, calibrate_tolerances
from p2prl.protocol import GenerationSpec, PatchSpec, decode_message
from p2prl.rl import GenerationParams, build_default_model, get_task, load_model, model_meta

SPEC = Path(__file__).parents[2] / "docs" / "PROTOCOL.md"
NETWORK = "indie-net"
POSITION_TAG = b"p2prl/validator/position-secret/v1"

indie = pytest.importorskip("indie.miner")


@pytest.fixture(scope="module")
def world(model_cache):
    path = build_default_model(model_cache)
    model, tok = load_model(path)
    meta = model_meta(path)
    gen = GenerationSpec(stop_token_ids=(1,))
    genesis = {  # the sections a miner reads, as a genesis body holds them (§3)
        "generation": {**dataclasses.asdict(gen), "stop_token_ids": [1]},
        "task": {"name": "addition", "params": {"digits": meta["task"]["digits"]}},
        "prompt": {"format": "raw", "system": ""},
        "patch": dataclasses.asdict(PatchSpec()),
    }
    task = get_task("addition", digits=meta["task"]["digits"])
    mh = meta["weights_hash"]  # version 0's manifest hash: the genesis model.weights_hash
    params = GenerationParams(gen.max_new_tokens, gen.temperature, gen.top_p)
    vcfg, _ = calibrate_tolerances(model, tok, task, params, mh, ValidatorConfig(generation=gen))
    return path, genesis, model, tok, task, mh, vcfg


def validator(world) -> RolloutValidator:
    _, _, model, tok, task, mh, vcfg = world
    secret = Identity(b"v" * 32).sign(POSITION_TAG)  # as a validator node makes it
    return RolloutValidator(
        lambda v: (mh, model) if v == 0 else None, tok, task, vcfg, position_secret=secret
    )


def mine_and_judge(world, batches: int, deviation=None, seed: bytes = b"m" * 32):
    path, genesis, *_, mh, vcfg = world
    miner = indie.IndieMiner(path, genesis, seed, deviation or indie.Deviation.NONE)
    v = validator(world)
    verdicts = []
    for _ in range(batches):
        blob, envelope = miner.mine(0, mh, vcfg.generation.groups_per_batch, NETWORK)
        env, ann = decode_message(envelope, NETWORK)  # its envelope and canonical JSON verify
        verdicts.append(v.check(ann, env.signer, blob, current_version=0))
    return verdicts


def test_the_indie_miner_reproduces_the_spec_examples() -> None:
    assert indie.check_spec_examples(SPEC.read_text()) == 11


def test_the_indie_miner_imports_nothing_from_p2prl() -> None:
    tree = ast.parse((Path(__file__).parent / "indie" / "miner.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [m for m in names if m.split(".")[0] == "p2prl"]


def _accepted(verdicts) -> tuple[int, int, dict]:
    total = sum(len(g.rollouts) for bv in verdicts for g in bv.valid_groups)
    rollouts = sum(len(bv.groups) for bv in verdicts) * 8
    reasons: dict[str, int] = {}
    for bv in verdicts:
        for k, n in bv.reasons().items():
            reasons[k] = reasons.get(k, 0) + n
    return total, rollouts, reasons


def test_honest_indie_batches_are_accepted(world) -> None:
    """Two batches (128 rollouts) of the default genesis; the slow test runs 1,024."""
    total, rollouts, reasons = _accepted(mine_and_judge(world, 2))
    assert reasons == {"ok": 16} and total == rollouts == 128


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_thousand_indie_rollouts_are_all_accepted(world) -> None:
    verdicts = mine_and_judge(world, 16, seed=b"k" * 32)
    total, rollouts, reasons = _accepted(verdicts)
    print(json.dumps({"rollouts": rollouts, "accepted": total, "reasons": reasons}))
    assert reasons == {"ok": 128} and total == rollouts == 1024


@pytest.mark.parametrize(
    "deviation,reason",
    [("FINGERPRINT_POSITION", "fingerprint"), ("REDRAWN", "sampling"), ("SHARPENED", "sampling")],
)
def test_each_deviation_is_rejected_with_the_spec_reason(world, deviation, reason) -> None:
    (bv,) = mine_and_judge(world, 1, getattr(indie.Deviation, deviation))
    assert bv.hard_failure and reason in bv.reasons(), bv.reasons()
    assert not bv.valid_groups


def test_the_indie_miner_follows_the_trainers_receipts_with_batches_p2prl_trains(world) -> None:
    """§14 is exact enough for a chained batch: the indie miner reads a ``receipts`` list that p2prl's
    trainer signed, follows its receipt with a batch that p2prl's validator judges on the chain seed
    and accepts, and that the trainer's book takes as the one batch its receipt seeds."""
    from p2prl.node.trainer.receipts import ReceiptBook
    from p2prl.protocol import RolloutAnnouncement

    path, genesis, *_ = world
    trainer = Identity(b"t" * 32)
    book = ReceiptBook(trainer, NETWORK)
    miner = indie.IndieMiner(path, genesis, b"r" * 32)
    *_, mh, vcfg = world
    n = vcfg.generation.groups_per_batch
    first_blob, first_env = miner.mine(0, mh, n, NETWORK)
    _, first = decode_message(first_env, NETWORK)
    assert isinstance(first, RolloutAnnouncement) and not first.chained  # no receipt yet: a chain start
    assert book.add(miner.miner, first.blob.id, trusted=True) is None
    raw = book.take()
    assert raw is not None and miner.on_receipts(raw, trainer.public_key, NETWORK) == 1
    assert miner.on_receipts(raw, Identity(b"x" * 32).public_key, NETWORK) == 0  # not the trainer's
    blob, env_raw = miner.mine(0, mh, n, NETWORK)
    env, ann = decode_message(env_raw, NETWORK)
    assert isinstance(ann, RolloutAnnouncement) and ann.chained
    assert ann.prev == first.blob.id and ann.receipts == hashlib.sha256(raw).hexdigest()
    _, _, model, tok, task, _, _ = world
    secret = Identity(b"v" * 32).sign(POSITION_TAG)
    lists = {ann.receipts: frozenset(decode_message(raw, NETWORK)[1].entries)}
    v = RolloutValidator(
        lambda ver: (mh, model) if ver == 0 else None, tok, task, vcfg, position_secret=secret, receipts=lists.get
    )
    assert v.check(first, env.signer, first_blob, current_version=0).reasons() == {"ok": n}
    verdict = v.check(ann, env.signer, blob, current_version=0)
    assert verdict.reasons() == {"ok": n} and not verdict.hard_failure
    assert book.seeds(env.signer.hex(), ann) and not book.seeds(env.signer.hex(), ann)  # one batch a receipt


def test_the_indie_miner_draws_what_p2prls_miner_draws(world) -> None:
    """§10 and §11.4 are exact enough to reproduce p2prl's own miner bit for bit: same tokens, same
    float32 logprobs, same sketches (both run one group's samples side by side, as the spec allows)."""
    import numpy as np

    from p2prl.proof import mine_batch
    from p2prl.rl import HFEngine

    path, genesis, model, tok, task, mh, vcfg = world
    gen = vcfg.generation
    miner = indie.IndieMiner(path, genesis, b"c" * 32)
    params = GenerationParams(gen.max_new_tokens, gen.temperature, gen.top_p)
    ours = mine_batch(
        HFEngine(model, tok, max_batch=gen.group_size),
        task,
        0,
        mh,
        miner.miner,
        [0, 1],
        gen.group_size,
        params,
    )
    same = 0
    for g in ours.batch.groups:
        prompt, _ = indie.addition_problem(
            indie.prompt_seed(mh, miner.miner, g.index), genesis["task"]["params"]["digits"]
        )
        assert miner.tok.encode(prompt, add_special_tokens=False).ids == g.prompt_ids.tolist()
        for r, (ids, lps, hid) in zip(
            g.rollouts, miner.complete_group(g.prompt_ids.tolist(), mh, g.index), strict=True
        ):
            same += (
                r.completion_ids.tolist() == ids
                and np.array_equal(r.logprobs, np.array(lps, dtype=np.float32))
                and np.array_equal(r.sketches, indie.sketch(hid, mh))
            )
    assert same == 16
