"""Any HF causal LM on the network: random-init Qwen2 and Llama directories with a trained BPE tokenizer
and a chat template, pinned by genesis, run by trainer, validator and miner (real libp2p hosts on
127.0.0.1). Miners follow the trainer bit for bit and the validator accepts their chat-formatted
rollouts (it rebuilds every prompt with its own tokenizer: a differing id is a prompt_mismatch)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from safetensors.torch import load_file, save_file

from p2prl.bench.dishonest import perturb_state
from p2prl.demo import S3Server
from p2prl.node.run import start_node
from p2prl.node.runtime.role import NodeStartError
from p2prl.node.weights.version import sha256_of_state

CHAT = {"prompt_format": "chat", "system_prompt": "Answer with the number.", "max_new_tokens": 3}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_hf_model_network(make_net, wait_for, hf_model_dir: Callable[..., Path], arch: str) -> None:
    d = hf_model_dir(arch)
    net = make_net(("trainer", "validator", "miner1"), model=d, **CHAT)
    t = start_node(net.config("trainer", model=d))
    v = m = None
    try:
        wait_for(lambda: t.role.chain.version == 0, 60, "version 0")
        t.role.pause()  # a random model gives equal rewards: versions move when this test publishes
        v = start_node(net.config("validator", model=d, report_weights_sha256=True))
        m = start_node(net.config("miner1", model=d))
        for seed in (1, 2):
            t.role.publish(perturb_state(t.role.chain.state, 0.01, seed=seed))
        want = sha256_of_state(t.role.chain.state)
        wait_for(lambda: m.role.active.version == 2 and v.role.current.version == 2, 90, "v2 everywhere")
        # the validator's one set of tensors steps back to check older batches: its status has the
        # SHA-256 of the version it reached, taken when it reached it
        wait_for(lambda: v.rt.status.get("weights_sha256") == want, 30, "validator's v2 reported")
        assert sha256_of_state(m.role.active.state) == want
        wait_for(lambda: v.rt.status.counter("groups_accepted") > 0, 120, "accepted groups")
        rejected = v.rt.status.snapshot()["labelled"].get("rejected", {})
        assert "prompt_mismatch" not in rejected, rejected
    finally:
        for node in (m, v, t):
            if node is not None:
                node.close()


def test_local_copy_checked_against_genesis(
    make_net, hf_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    d = hf_model_dir("qwen2")
    net = make_net(("trainer", "validator", "miner1"), model=d, **CHAT)
    other = shutil.copytree(d, tmp_path / "copy")
    (other / "tokenizer_config.json").write_text((d / "tokenizer_config.json").read_text() + " ")
    with pytest.raises(NodeStartError, match="tokenizer files differ from the genesis"):
        start_node(net.config("miner1", model=other))
    (other / "tokenizer_config.json").write_text((d / "tokenizer_config.json").read_text())
    weights = load_file(str(other / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(NodeStartError, match="weights differ from the genesis"):
        start_node(net.config("miner1", model=other))
    # no --model, nothing cached, no peer holding the files and no S3: it never starts on nothing
    with pytest.raises(NodeStartError, match="cannot fetch model_files"):
        start_node(net.config("miner1", model_cache=tmp_path / "empty", fetch_timeout_s=2.0))
    # the trainer is the files' source: without --model it says so at once instead of waiting
    with pytest.raises(NodeStartError, match="is not on this machine: pass --model DIR"):
        start_node(net.config("trainer", model_cache=tmp_path / "empty"))


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    for k, val in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, val)
    server = S3Server().start()
    server.create_bucket("hf-join")
    yield server, {"s3_enable": True, "s3_bucket": "hf-join", "s3_endpoint": server.endpoint}
    server.stop()


@pytest.mark.slow
def test_join_with_nothing_but_the_genesis(make_net, wait_for, hf_model_dir: Callable[..., Path], s3) -> None:
    """A miner on an empty data dir gets the model files from the trainer and the weights from the
    version-0 anchor; with the trainer gone, from S3; a tampered S3 copy is refused and counted."""
    server, s3kw = s3
    d = hf_model_dir("qwen2")
    net = make_net(("trainer", "validator", "miner1", "miner2", "miner3"), model=d, **CHAT)
    t = start_node(net.config("trainer", model=d, **s3kw))
    m = None
    try:
        wait_for(lambda: t.role.chain.version == 0, 60, "version 0")
        t.role.pause()
        cache = net.root / "miner1" / "model"
        m = start_node(net.config("miner1", model_cache=cache, **s3kw))
        files = m.rt.genesis.genesis.asset(m.rt.genesis.genesis.model.files_sha256)
        assert m.rt.status.snapshot()["labelled"]["assets_fetched"] == {"model_files": 1}
        wait_for(lambda: m.role.active.hash == t.role.chain.result_hash, 90, "miner in sync")
        assert sha256_of_state(m.role.active.state) == sha256_of_state(t.role.chain.state)
        fetched = next(cache.iterdir())
        assert (fetched / "config.json").read_bytes() == (d / "config.json").read_bytes()
        assert m.rt.store.has(files.id)  # kept, so it is served to the next joiner
        head = t.role.chain.result_hash
    finally:
        for node in (m, t):
            if node is not None:
                node.close()
    # every peer gone: files and weights from the S3 mirror
    m2 = start_node(net.config("miner2", model_cache=net.root / "miner2" / "model", **s3kw))
    try:
        wait_for(lambda: m2.role.active.hash == head, 120, "miner2 in sync from S3")
    finally:
        m2.close()
    # a tampered S3 copy: every chunk is checked against the genesis, nothing is installed
    key = f"{m2.rt.net.s3.blob_key(files.id)}"
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    body = client.get_object(Bucket="hf-join", Key=key)["Body"].read()
    client.put_object(Bucket="hf-join", Key=key, Body=body[:-1] + bytes([body[-1] ^ 1]))
    with pytest.raises(NodeStartError, match="cannot fetch model_files"):
        start_node(
            net.config("miner3", model_cache=net.root / "miner3" / "model", fetch_timeout_s=15.0, **s3kw)
        )
    assert not list((net.root / "miner3" / "model").glob("*/config.json"))
