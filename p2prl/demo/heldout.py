"""The demo's held-out evaluation: the base model and the weights the miners ended on, greedy on the
fixed problem set no node samples from (``p2prl.rl.evaluate``), in the genesis's own settings.

It runs after the nodes have stopped (it would otherwise take the cores the run is measured on) and
reads the last verified version a miner saved (its ``weights/current.json``), the very weights the
trainer published, hashed on arrival.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def held_out(genesis: Path, model_dir: Path | None, model_cache: Path, weights_dir: Path, n: int) -> dict[str, Any]:
    """``{"problems", "first", "last", "version", "reward_first", "reward_last", "seconds"}``: accuracy of
    the base model (``first``) and of the saved version (``last``; None when no version was saved)."""
    import torch

    from p2prl.node import load_saved_weights, read_genesis
    from p2prl.rl import (
        build_default_model,
        copy_state_in_place,
        get_task,
        load_model,
        load_tokenizer,
    )
    from p2prl.rl import evaluate_policy as evaluate

    t0 = time.monotonic()
    g = read_genesis(genesis).genesis
    d = model_dir if model_dir is not None else build_default_model(model_cache)
    model, _ = load_model(d, dtype=torch.bfloat16)
    tok = load_tokenizer(d, g.prompt.format, g.prompt.system, tuple(g.generation.stop_token_ids))
    task = get_task(g.task.name, **g.task.params)
    first = evaluate(model, tok, task, n, g.generation.max_new_tokens)
    out: dict[str, Any] = {
        "problems": n,
        "first": first["accuracy"],
        "reward_first": round(first["reward"], 4),
        "last": None,
        "reward_last": None,
        "version": None,
    }
    saved = load_saved_weights(weights_dir)
    if saved is not None:
        copy_state_in_place(model, saved.state)
        last = evaluate(model, tok, task, n, g.generation.max_new_tokens)
        out.update(last=last["accuracy"], reward_last=round(last["reward"], 4), version=saved.version)
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out
