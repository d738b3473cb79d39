"""Honest batches at a temperature and top-p below 1 (a vLLM network's usual settings) are accepted:
the pick, the miner's logprobs and the validator's checks cut top-p alike (docs/PROTOCOL.md §10)."""

from __future__ import annotations

from dataclasses import replace

from proofkit import GENERATION, GROUP, MH, MINER, VERSION, World

from p2prl.proof.miner import mine_batch
from p2prl.reasons import VerdictReason as R
from p2prl.rl.engine import GenerationParams, HFEngine


def test_honest_batches_at_top_p_below_one_are_accepted(world: World) -> None:
    for temperature, top_p in ((0.7, 0.9), (1.0, 0.5)):
        gen = replace(GENERATION, temperature_milli=int(temperature * 1000), top_p_milli=int(top_p * 1000))
        v = world.validator(config=replace(world.config, generation=gen))
        eng = HFEngine(world.model, world.tok, max_batch=64)
        params = GenerationParams(gen.max_new_tokens, temperature, top_p, seed=5)
        for b in range(12):
            p = mine_batch(eng, world.task, VERSION, MH, MINER, list(range(4 * b, 4 * b + 4)), GROUP, params)
            verdict = v.check(p.announcement, MINER, p.blob, VERSION)
            assert {g.reason for g in verdict.groups} == {R.OK}, (temperature, top_p, b, verdict.reasons())
            assert verdict.stats.sampling_misses == 0
