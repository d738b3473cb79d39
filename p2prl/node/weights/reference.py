"""The founder's reference run: the validators' tolerances measured before the genesis is signed.

A validator that calibrates measures how far honest batches of its own engine land from its forward
pass. One whose miners run elsewhere (another device, another engine) cannot, and used to judge with
code defaults loose enough for any pair of engines; so does every validator while its first
calibration runs (minutes on a real model). The founder measures instead, once, at version 0, with
each engine the network's miners will run mining the reference batches (``calibrate``'s
``other_engines``: the loosest pair is held), and pins the result in the genesis (``ProofSpec``),
which every node verifies with the trainer's signature. The reference batches use calibration's
fixed key and seeds, so anyone with the same engines can measure the same figures again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2prl.node.weights.disk import load_base_model, model_dir_for
from p2prl.node.weights.engine import VLLMMinerEngine
from p2prl.proof import MIN_TOKENS, ValidatorConfig, calibrate_tolerances
from p2prl.protocol import Genesis, ProofSpec
from p2prl.rl import GenerationParams, choose_engine, get_task, has_weights, open_vllm

log = logging.getLogger(__name__)

ENGINES = ("hf", "vllm")


def reference_proof(
    g: Genesis,
    cache_dir: Path,
    model_dir: Path | None,
    engines: Sequence[str],
    device: str = "cpu",
    min_tokens: int = MIN_TOKENS,
) -> ProofSpec:
    """Tolerances for the genesis ``g`` (its model, task and generation settings) from honest batches
    each of ``engines`` mines at version 0 on ``device``, judged by the transformers forward pass on
    the CPU (the validator's). The transformers engine always mines beside the others. Unlike a
    validator's calibration, which must start judging, it mines until every engine had ``min_tokens``
    checked however long that takes (an engine that is exact stops after its first batches). Raises
    ValueError for an unknown engine and EngineChoiceError where vLLM cannot run the model."""
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        raise ValueError(f"reference engines must be among {', '.join(ENGINES)}, not {', '.join(unknown) or 'none'}")
    t0 = time.monotonic()
    model, tok, _, weights_hash = load_base_model(g, cache_dir, model_dir)
    task = get_task(g.task.name, **dict(g.task.params))
    gen = GenerationParams(
        max_new_tokens=g.generation.max_new_tokens,
        temperature=g.generation.temperature,
        top_p=g.generation.top_p,
        seed=0,
    )
    base = ValidatorConfig.from_genesis(dataclasses.replace(g, proof=None))
    others: list[Any] = []
    opened: list[VLLMMinerEngine] = []
    if "vllm" in engines:
        path = Path(model_dir_for(g.model, model_dir, cache_dir))
        choose_engine("vllm", device, path)
        kw: dict[str, bool | str] = {"enforce_eager": not device.startswith("cuda")}
        if not has_weights(path):
            kw["load_format"] = "dummy"
        inner = open_vllm(path, tok, device, **kw)
        inner.update(model.state_dict())  # version 0, whatever the directory holds
        opened.append(VLLMMinerEngine(inner, model))
        others.append(lambda _batch, e=opened[-1]: e)
    try:
        cfg, drift = calibrate_tolerances(
            model, tok, task, gen, weights_hash, base, other_engines=others, min_tokens=min_tokens, more_s=math.inf
        )
    finally:
        for e in opened:
            e.close()
    names = tuple(dict.fromkeys(f"{e}-{device}" for e in ("hf", *engines)))
    log.info(
        "reference run in %.1f s over %d tokens (%s): margin %.4f, fingerprint %.4f",
        time.monotonic() - t0,
        int(drift["sampling_tokens"]),
        ", ".join(names),
        cfg.sampling_margin,
        cfg.fingerprint_tol,
    )
    return cfg.pinned(names, int(drift["sampling_tokens"]))
