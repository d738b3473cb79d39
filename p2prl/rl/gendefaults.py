"""Generation settings a run derives from its model when the user names none.

The built-in tiny model answers ``"12+34="`` in at most four characters; a pretrained chat model
needs its chat template, room to write an answer, and a task that reads the answer the way such a
model writes it. So the defaults come from the model directory: the ``chat`` prompt format when the
tokenizer has a chat template, a completion bound per task, and for ``addition`` the ``chat`` style
(first number read, shaped credit). Every choice can still be given explicitly; a choice the model
cannot serve (``chat`` without a template, a directory that is no causal LM) is refused here in one
line, before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2prl.rl.modeldir import ModelDirError, check_causal_lm, has_chat_template

TOY_NEW_TOKENS = 4  # the built-in model: two digits of sum, a carry digit, its eos
# a pretrained model's completion bound per task: enough for a short stated answer, no more (every
# token costs generation, proof and training time on every node)
MODEL_NEW_TOKENS = {"addition": 16, "digit-start": 16, "countdown": 64, "gsm8k": 256}
OTHER_NEW_TOKENS = 128
# a pretrained model's learning rate: the built-in model's 3e-4 is sized for 138k parameters trained
# from a weak warm start; full fine-tuning a pretrained 100M+ model with Adam at that rate wrecks it.
# On SmolLM2-135M, 14 steps of 8 prompts x 8 samples (docs/benchmarks/real-model.md): at 4e-5 held-out
# greedy accuracy 0.203 -> 0.250 (64 problems) and sampled reward 0.216 -> 0.289; at 1e-5 no gain
MODEL_LR = 4e-5


@dataclass(frozen=True)
class RunDefaults:
    """The model directory (None: the built-in model) and the settings a run uses with it."""

    model_dir: Path | None
    task: str
    task_params: dict[str, Any] = field(default_factory=dict)
    prompt_format: str = "raw"
    max_new_tokens: int = TOY_NEW_TOKENS


def run_defaults(
    model_dir: Path | None,
    task: str = "addition",
    task_params: dict[str, Any] | None = None,
    prompt_format: str | None = None,
    max_new_tokens: int = 0,
) -> RunDefaults:
    """Fill what is unset (``None``/0/absent) from the model; raise :class:`ModelDirError` or
    ValueError with one line for a choice the model cannot serve."""
    params = dict(task_params or {})
    if model_dir is None:
        if task == "addition":
            params.setdefault("digits", 2)
        return RunDefaults(None, task, params, prompt_format or "raw", max_new_tokens or TOY_NEW_TOKENS)
    d = Path(model_dir)
    check_causal_lm(d)
    template = has_chat_template(d)
    fmt = prompt_format or ("chat" if template else "raw")
    if fmt == "chat" and not template:
        raise ModelDirError(f"{d} has no chat template, so --prompt-format chat cannot work; use raw")
    if task == "addition" and fmt == "chat":
        params.setdefault("style", "chat")
    return RunDefaults(d, task, params, fmt, max_new_tokens or MODEL_NEW_TOKENS.get(task, OTHER_NEW_TOKENS))
