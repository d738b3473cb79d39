"""Random-initialised Hugging Face model directories with a byte-level BPE tokenizer and a chat template.

No pretrained model can be downloaded here, so tests and benchmarks build the directories an operator
would hold (Qwen2, Qwen3, Llama; tiny, or shaped like Qwen2.5-0.5B) from a config, a fixed seed and a
tokenizer trained on the spot with the ``tokenizers`` package. The result is an ordinary directory:
config.json, model.safetensors (optionally sharded), tokenizer files with a ChatML chat template and
a generation_config.json whose ``eos_token_id`` names the end-of-turn token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from p2prl.rl.model import warm_start
from p2prl.rl.tasks import AdditionTask
from p2prl.rl.tokenizer import TextTokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
QWEN25_05B = {  # Qwen2.5-0.5B's shape (its vocabulary is replaced by the trained one)
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
# The smallest shape vLLM's CPU attention takes (head size 64: it refuses TINY's 8) at std 0.1, so
# next-token distributions are peaked as a trained model's are: the vLLM tests, demo and benchmark.
VLLM_TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,
}
ARCHS = ("qwen2", "qwen3", "llama")


def _corpus() -> list[str]:
    lines = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)]
    lines += [
        "What is the answer? Think step by step.",
        "You are a careful assistant.",
        "user assistant system",
    ]
    return lines


def train_bpe_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained on a small arithmetic corpus, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _config(arch: str, vocab: int, shape: dict[str, int], eos: list[int], pad: int) -> Any:
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
    extra = {"head_dim": shape["hidden_size"] // shape["num_attention_heads"]} if arch == "qwen3" else {}
    return cls(
        vocab_size=vocab,
        tie_word_embeddings=arch != "llama",
        bos_token_id=None,
        eos_token_id=eos[0],
        pad_token_id=pad,
        **shape,
        **extra,
    )


def build_random_model_dir(
    out: Path,
    arch: str = "qwen2",
    shape: dict[str, int] | None = None,
    seed: int = 0,
    shard_kb: int = 0,
    warm_steps: int = 0,
) -> Path:
    """Write a random-init ``arch`` model in bf16 with a trained BPE tokenizer into ``out``.

    ``shard_kb`` > 0 splits the weights into safetensors shards of about that many KB, with an index.
    ``warm_steps`` > 0 first fits one-digit addition in the chat format for that many steps, so
    sampled groups have mixed rewards (a purely random model gives GRPO nothing to learn from).
    """
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}")
    hf_logging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_bpe_tokenizer()
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = _config(arch, len(tok), shape or TINY, [im_end, eot], eot)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if warm_steps:
        chat = TextTokenizer(tok, "chat")
        warm_start(
            model,
            chat,
            AdditionTask(digits=1),
            {"seed": seed, "steps": warm_steps, "batch": 32, "lr": 3e-3},
            im_end,
        )
    model = model.to(torch.bfloat16)
    kw = {"max_shard_size": f"{shard_kb}KB"} if shard_kb else {}
    model.save_pretrained(str(out), **kw)
    GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=None).save_pretrained(
        str(out)
    )
    tok.save_pretrained(str(out))
    return out
