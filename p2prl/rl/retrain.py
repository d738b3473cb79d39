"""Rerun the recipe of the shipped default weights and say whether this CPU gives the same bits.

``python -m p2prl.rl.retrain [--out FILE]``: trains ``train_default_model`` (≈ 2 min on one core),
prints its weights hash next to the shipped one and its greedy success, and with ``--out`` writes
its weights as a safetensors file (what ``rl/data`` ships, for a new ``DEFAULT_MODEL_NAME``). The
hash depends on the CPU's float kernels (AVX2, AVX-512, AMX): a different one here is expected, not
an error; the network only ever uses the shipped file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from p2prl.rl.evaluate import greedy_success
from p2prl.rl.model import (
    DEFAULT_WEIGHTS_HASH,
    DIGITS,
    train_default_model,
    unique_state,
    weights_hash,
)
from p2prl.rl.tasks import AdditionTask
from p2prl.rl.tokenizer import CharTokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m p2prl.rl.retrain", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the trained bf16 weights here (.safetensors)")
    args = ap.parse_args(argv)
    model = train_default_model()
    state = unique_state(model)
    got = weights_hash(state)
    success = greedy_success(model, CharTokenizer(), AdditionTask(digits=DIGITS), n=256, max_new_tokens=DIGITS + 2)
    print(f"trained here:   {got}  greedy success {success:.4f}")
    print(f"shipped:        {DEFAULT_WEIGHTS_HASH}")
    print("same bits" if got == DEFAULT_WEIGHTS_HASH else "other bits (this CPU's float kernels differ)")
    if args.out is not None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(args.out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
