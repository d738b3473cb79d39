"""Shared helpers for the proof tests: a small random-init Qwen2 model on the char tokenizer, and a miner/validator pair."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from p2prl.proof.miner import PreparedBatch, mine_batch
from p2prl.proof.validate import RolloutValidator, ValidatorConfig
from p2prl.protocol import GenerationSpec
from p2prl.rl.engine import GenerationParams, HFEngine
from p2prl.rl.tasks import derive_seed, get_task
from p2prl.rl.tokenizer import CharTokenizer

MH = "ab" * 32  # the version's manifest hash (public randomness)
POSITION_SECRET = bytes(range(32))  # the tests' validators: which rollouts and positions are recomputed
VERSION = 3
MINER = bytes(range(32))
OTHER_MINER = bytes(range(1, 33))
GROUP = 4
GENERATION = GenerationSpec(max_new_tokens=8, group_size=GROUP)  # the network's: temperature and top-p 1
PARAMS = GenerationParams(GENERATION.max_new_tokens, GENERATION.temperature, GENERATION.top_p, seed=5)


def small_model(seed: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=CharTokenizer().vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.1,
        pad_token_id=0,
        eos_token_id=1,
    )
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()


@dataclass
class World:
    model: Any
    other: Any
    tok: CharTokenizer
    task: Any
    config: ValidatorConfig

    def validator(self, **kw: Any) -> RolloutValidator:
        """A validator of VERSION; its position secret fixed (a random one would make which rollouts
        and positions it recomputes, and so a test's outcome, a matter of chance)."""
        kw.setdefault("position_secret", POSITION_SECRET)
        kw.setdefault("config", self.config)
        return RolloutValidator.for_model(self.model, self.tok, self.task, VERSION, MH, **kw)

    def mine(
        self,
        model: Any = None,
        key: bytes = MINER,
        indices: tuple[int, ...] = (0, 1),
        batch: int = 8,
        seed: int = 5,
        chain: tuple[str, str] | None = None,
    ) -> PreparedBatch:
        eng = HFEngine(model if model is not None else self.model, self.tok, max_batch=batch)
        params = GenerationParams(PARAMS.max_new_tokens, PARAMS.temperature, PARAMS.top_p, seed)
        return mine_batch(eng, self.task, VERSION, MH, key, list(indices), GROUP, params, chain)


def make_world() -> World:
    # every rollout recomputed: each test breaks one rollout and expects that check to see it; tests
    # pick prompt indices freely (the index-order rule has its own tests, which turn it on)
    cfg = ValidatorConfig(
        generation=GENERATION,
        max_staleness=2,
        fixed_group_count=False,  # batches of any count (the genesis count has its own tests)
        checked_per_group=0,
        contiguous_indices=False,
    )
    return World(small_model(0), small_model(1), CharTokenizer(), get_task("addition", digits=1), cfg)


def retarget(world: World, index: int, key: bytes) -> int:
    """An index under ``key`` whose derived problem equals MINER's problem ``index``."""
    want = world.task.problem(derive_seed(MH, MINER, index))
    for j in range(100_000):
        if world.task.problem(derive_seed(MH, key, j)) == want:
            return j
    raise AssertionError("no index found")
