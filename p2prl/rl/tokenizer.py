"""Tokenizers: every model's is a Hugging Face tokenizer, wrapped to the face engines and tasks need.

The default model's character vocabulary is an ordinary ``tokenizers`` tokenizer (a BPE model with
single characters and no merges), saved as ``tokenizer.json`` like any other, so one code path loads
every model. Ids of the char vocabulary: 0 = pad, 1 = eos, 2 = unk, then printable ASCII and newline.

Prompts go through :meth:`TextTokenizer.encode_prompt`, which applies the format the genesis pins
(``raw`` text, or the tokenizer's chat template with the pinned system prompt), so a miner and a
validator holding the same verified files produce the same token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHAR_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
PROMPT_FORMATS = ("raw", "chat")


class Tokenizer(Protocol):
    """What engines, tasks and the trainer need from a tokenizer."""

    eos_id: int
    pad_id: int
    vocab_size: int
    stop_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def char_fast_tokenizer() -> Any:
    """The default model's char vocabulary as a ``transformers`` fast tokenizer (built, not loaded)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(CHAR_SPECIALS + CHAR_CHARS)}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


class TextTokenizer:
    """Adapter over a ``transformers`` tokenizer: plain encode/decode, prompt formatting, stop ids."""

    def __init__(
        self, tok: Any, prompt_format: str = "raw", system: str = "", stop_ids: tuple[int, ...] = ()
    ) -> None:
        if tok.eos_token_id is None:
            raise ValueError("tokenizer has no eos token")
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt format must be one of {PROMPT_FORMATS}")
        if prompt_format == "chat" and not getattr(tok, "chat_template", None):
            raise ValueError("prompt format chat needs a tokenizer with a chat template")
        self.tok = tok
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.vocab_size = len(tok)
        self.stop_ids = tuple(dict.fromkeys((self.eos_id, *stop_ids)))
        self.prompt_format = prompt_format
        self.system = system

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_text(self, text: str) -> str:
        """The prompt as the model sees it: ``text`` itself, or rendered through the chat template."""
        if self.prompt_format == "raw":
            return text
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": text})
        return str(self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a task prompt in the pinned format (special tokens come from the template)."""
        return self.encode(self.prompt_text(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


class CharTokenizer(TextTokenizer):
    """The default model's tokenizer, built in memory (the same ids as its saved ``tokenizer.json``)."""

    def __init__(self) -> None:
        super().__init__(char_fast_tokenizer())

    def save(self, directory: Path) -> None:
        self.tok.save_pretrained(str(directory))


def load_tokenizer(
    directory: Path, prompt_format: str = "raw", system: str = "", stop_ids: tuple[int, ...] = ()
) -> TextTokenizer:
    """The directory's tokenizer (local files only, nothing downloaded) in the given prompt format."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return TextTokenizer(tok, prompt_format, system, stop_ids)
