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

from p2prl.node.runtime.task import params_of
from p2prl.node.weights.disk import load_base_model, model_dir_for
from p2prl.node.weights.engine import reference_vllm
from p2prl.node.weights.isa import IsaEngine
from p2prl.proof import MIN_TOKENS, ValidatorConfig, calibrate_tolerances
from p2prl.protocol import Genesis, ProofSpec
from p2prl.rl import get_task

log = logging.getLogger(__name__)

ENGINES = ("hf", "vllm", "hf-avx2")


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
    ValueError for an unknown engine and EngineChoiceError where vLLM cannot run the model.

    ``hf-avx2``: transformers with the kernels of an AVX2 CPU (``isa.IsaEngine``), on a founder's
    AVX-512 or AMX machine, so what is pinned holds between miners and validators of both
    generations (on an AVX2 machine it is the ``hf`` engine again)."""
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        raise ValueError(f"reference engines must be among {', '.join(ENGINES)}, not {', '.join(unknown) or 'none'}")
    if "hf-avx2" in engines and device != "cpu":
        raise ValueError("hf-avx2 is a CPU's engine: pin it with --pin-device cpu")
    t0 = time.monotonic()
    model, tok, _, weights_hash = load_base_model(g, cache_dir, model_dir)
    task = get_task(g.task.name, **dict(g.task.params))
    base = ValidatorConfig.from_genesis(dataclasses.replace(g, proof=None))
    vllm = None
    if "vllm" in engines:
        vllm = reference_vllm(Path(model_dir_for(g.model, model_dir, cache_dir)), model, tok, device)
    others: list[Any] = [] if vllm is None else [lambda _batch: vllm]
    older = None
    try:
        if "hf-avx2" in engines:
            older = IsaEngine("avx2", model, tok)
            log.info("reference engine hf-avx2 runs torch's %s kernels", older.capability)
            others.append(older.sized)
        cfg, drift = calibrate_tolerances(
            model, tok, task, params_of(g.generation), weights_hash, base, other_engines=others,
            min_tokens=min_tokens, more_s=math.inf,
        )
    finally:
        if vllm is not None:
            vllm.close()
        if older is not None:
            older.close()
    names = tuple(dict.fromkeys(_name(e, device) for e in ("hf", *engines)))
    log.info(
        "reference run in %.1f s over %d tokens (%s): margin %.4f, fingerprint %.4f",
        time.monotonic() - t0,
        int(drift["sampling_tokens"]),
        ", ".join(names),
        cfg.sampling_margin,
        cfg.fingerprint_tol,
    )
    return cfg.pinned(names, int(drift["sampling_tokens"]))


def _name(engine: str, device: str) -> str:
    """The engine's name in the genesis: ``hf-cpu``, ``vllm-cuda``, ``hf-cpu-avx2``."""
    if engine == "hf-avx2":
        return "hf-cpu-avx2"
    return f"{engine}-{device}"
