"""Any HF causal LM on the network: random-init Qwen2 and Llama directories with a trained BPE tokenizer
and a chat template, pinned by genesis, run by trainer, validator and miner (real libp2p hosts on
127.0.0.1). Miners follow the trainer bit for bit and the validator accepts their chat-formatted
rollouts (it rebuilds every prompt with its own tokenizer: a differing id is a prompt_mismatch)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from p2prl.node.context import NodeStartError
from p2prl.node.miner import perturb_state
from p2prl.node.runtime import start_node
from p2prl.node.weights import sha256_of_state

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
        v = start_node(net.config("validator", model=d))
        m = start_node(net.config("miner1", model=d))
        for seed in (1, 2):
            t.role.publish(perturb_state(t.role.chain.state, 0.01, seed=seed))
        want = sha256_of_state(t.role.chain.state)
        wait_for(lambda: m.role.active.version == 2 and v.role.current.version == 2, 90, "v2 everywhere")
        assert sha256_of_state(m.role.active.state) == want == sha256_of_state(v.role.current.state)
        wait_for(lambda: v.ctx.status.counter("groups_accepted") > 0, 120, "accepted groups")
        rejected = v.ctx.status.snapshot()["labelled"].get("rejected", {})
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
    with pytest.raises(NodeStartError, match="not on this machine: pass --model"):
        start_node(net.config("miner1"))
