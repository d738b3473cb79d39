"""Char-level tokenizer for the default model, plus an adapter giving HF tokenizers the same face.

Ids: 0 = pad, 1 = eos, 2 = unk, then printable ASCII (space..~) and newline. The vocabulary is fixed,
so any two nodes tokenize identically without shipping anything but the file that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

TOKENIZER_FILE = "p2prl_char_tokenizer.json"
_SPECIALS = ["<pad>", "<eos>", "<unk>"]
_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


class Tokenizer(Protocol):
    """What engines, tasks and the trainer need from a tokenizer."""

    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One token per character; specials are never produced by ``encode`` and skipped by ``decode``."""

    pad_id = 0
    eos_id = 1
    unk_id = 2

    def __init__(self) -> None:
        self.itos: list[str] = _SPECIALS + _CHARS
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(_CHARS, start=len(_SPECIALS))}
        self.vocab_size = len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: list[int]) -> str:
        n = len(_SPECIALS)
        return "".join(self.itos[i] for i in ids if n <= i < self.vocab_size)

    def save(self, directory: Path) -> None:
        spec = {"type": "p2prl-char", "specials": _SPECIALS, "chars": "".join(_CHARS)}
        (Path(directory) / TOKENIZER_FILE).write_text(json.dumps(spec, indent=1))

    @classmethod
    def load(cls, directory: Path) -> CharTokenizer:
        spec = json.loads((Path(directory) / TOKENIZER_FILE).read_text())
        tok = cls()
        if spec.get("specials") != _SPECIALS or spec.get("chars") != "".join(_CHARS):
            raise ValueError(f"unsupported char tokenizer spec in {directory}")
        return tok


class HFTokenizer:
    """Adapter over a ``transformers`` tokenizer loaded from a local model directory."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        if tok.eos_token_id is None:
            raise ValueError("tokenizer has no eos token")
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


def load_tokenizer(directory: Path) -> Tokenizer:
    """The char tokenizer when the directory names it, else the directory's HF tokenizer (local only)."""
    directory = Path(directory)
    if (directory / TOKENIZER_FILE).exists():
        return CharTokenizer.load(directory)
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
