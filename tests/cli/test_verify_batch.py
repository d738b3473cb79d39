"""``p2prl verify-batch`` re-runs a validator's judgement from a data directory and prints its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.crypto import Identity, save_identity
from p2prl.node import NetworkSpec, genesis_from_spec, write_genesis
from p2prl.node.runtime.journal import JOURNAL_DIR, Journal
from p2prl.node.setup.netinit import base_model_info
from p2prl.proof import mine_batch
from p2prl.protocol import encode_message
from p2prl.rl import (
    GenerationParams,
    HFEngine,
    build_default_model,
    get_task,
    load_tokenizer,
    load_weights_model,
)
from p2prl.store import BlobStore

runner = CliRunner()
NET = "verify-net"


@pytest.fixture(scope="module")
def setup(model_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("vb")
    trainer, validator, miner = (Identity(bytes([b]) * 32) for b in (1, 2, 3))
    sg = genesis_from_spec(
        NetworkSpec(network_id=NET, validators=[validator.public_hex]), trainer, base_model_info(model_cache)
    )
    write_genesis(sg, root / "genesis.json")
    save_identity(validator, root / "validator.key")
    path = build_default_model(model_cache)
    g = sg.genesis
    tok = load_tokenizer(path, g.prompt.format, g.prompt.system, g.generation.stop_token_ids)
    task = get_task(g.task.name, **dict(g.task.params))
    return root, sg, miner, path, tok, task


def mine(setup, model, data_dir: Path, journal: bool, chain: tuple[str, str] | None = None) -> tuple[str, bytes]:
    _, sg, miner, _, tok, task = setup
    g = sg.genesis
    gen = g.generation
    params = GenerationParams(gen.max_new_tokens, gen.temperature, gen.top_p)
    prepared = mine_batch(
        HFEngine(model, tok), task, 0, g.model.weights_hash, miner.public_key,
        list(range(gen.groups_per_batch)), gen.group_size, params, chain,
    )  # fmt: skip
    BlobStore(data_dir / "blobs").put(prepared.blob)
    envelope = encode_message(miner, NET, prepared.announcement)
    if journal:
        Journal(data_dir / JOURNAL_DIR, 1 << 20).record("in", envelope, prepared.announcement.blob.id)
    return prepared.announcement.blob.id, envelope


def run(root: Path, data_dir: Path, blob_id: str, model_cache: Path, *extra: str):
    args = ["verify-batch", blob_id, "--data-dir", str(data_dir), "--network", str(root / "genesis.json")]
    return runner.invoke(app, [*args, "--model-cache", str(model_cache), "--json", *extra])


def test_an_honest_batch_is_accepted_with_its_figures(setup, model_cache, tmp_path) -> None:
    root, *_ = setup
    model = load_weights_model(setup[3])
    blob_id, _ = mine(setup, model, tmp_path, journal=True)
    res = run(root, tmp_path, blob_id, model_cache, "--key", str(root / "validator.key"))
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert rec["announcement"].startswith("journal (signed by")
    assert rec["accepted_groups"] == len(rec["groups"]) == 8 and not rec["hard_failure"]
    assert rec["stats"]["rollouts_recomputed"] > 0 and rec["stats"]["sampling_misses"] == 0
    assert rec["stats"]["fingerprint_err_quantile"] <= rec["limits"]["fingerprint_tol"]


def test_a_batch_from_other_weights_is_rejected_and_says_why(setup, model_cache, tmp_path) -> None:
    """The operator's view of a disputed rejection: every figure, the one past its limit named."""
    root, *_ = setup
    model = load_weights_model(setup[3])
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.float().std().to(p.dtype) * 0.3)
    blob_id, envelope = mine(setup, model, tmp_path, journal=False)
    (tmp_path / "ann.hex").write_text(envelope.hex())
    res = run(root, tmp_path, blob_id, model_cache, "--announcement", str(tmp_path / "ann.hex"))
    assert res.exit_code == 1, res.output
    rec = json.loads(res.output)
    assert rec["hard_failure"] and rec["accepted_groups"] == 0
    reasons = {g["reason"] for g in rec["groups"]}
    assert reasons & {"fingerprint", "logprob", "sampling"}, reasons
    text = runner.invoke(
        app,
        ["verify-batch", blob_id, "--data-dir", str(tmp_path), "--network", str(root / "genesis.json"),
         "--model-cache", str(model_cache), "--announcement", str(tmp_path / "ann.hex")],
    ).output  # fmt: skip
    assert "verdict: 0/8 groups accepted, hard failure" in text and "fingerprint: 90th percentile" in text


def test_a_missing_blob_is_a_usage_error(setup, model_cache, tmp_path) -> None:
    root, *_ = setup
    res = run(root, tmp_path, "ab" * 32, model_cache)
    assert res.exit_code == 2 and "not in" in res.output


def test_a_chained_batch_is_judged_on_the_journaled_receipts_it_follows(setup, model_cache, tmp_path) -> None:
    """A chained batch's prompts come from the trainer's receipts list it names (docs/PROTOCOL.md §14):
    verified from the node's journal; without the list the batch cannot be judged (soft)."""
    import hashlib

    from p2prl.protocol import Receipts, receipt_id

    root, _, miner, *_ = setup
    trainer = Identity(bytes([1]) * 32)  # the genesis trainer's key (the fixture's)
    prev = "7a" * 32
    raw = encode_message(trainer, NET, Receipts(entries=(receipt_id(miner.public_key, prev),), nonce="00" * 16))
    digest = hashlib.sha256(raw).hexdigest()
    model = load_weights_model(setup[3])
    blob_id, _ = mine(setup, model, tmp_path, journal=True, chain=(prev, digest))
    res = run(root, tmp_path, blob_id, model_cache, "--no-calibrate")
    assert res.exit_code == 1 and {g["reason"] for g in json.loads(res.output)["groups"]} == {"unknown_receipts"}
    Journal(tmp_path / JOURNAL_DIR, 1 << 20).record("in", raw)
    res = run(root, tmp_path, blob_id, model_cache, "--no-calibrate")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["accepted_groups"] == 8
