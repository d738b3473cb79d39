"""Worked examples of every derived hash a genesis pins, computed by the code that pins them.

docs/PROTOCOL.md §9 prints them (``python -m p2prl.rl.hashexamples`` renders that section) and a test
keeps the two equal, so a second implementation can check its config, tokenizer, model-files, task-data
and weights hashes against these byte for byte. Inputs are small fixed files and tensors written here.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from p2prl.crypto import canonical_bytes
from p2prl.patch import sorted_names, weights_hash, weights_sha256
from p2prl.protocol import MIN_CHUNK_SIZE, blob_ref_for
from p2prl.rl.modeldir import config_sha256, pack_files, present_files, tokenizer_sha256

SECTION = "## 9. Worked examples: derived hashes"
WRAP = 96  # hex characters per line

# config.json as a trainer's model directory might hold it: floats, a non-ASCII string, keys out of
# order, and the two version stamps the hash leaves out
CONFIG_JSON = (
    "{\n"
    '  "architectures": ["Qwen2ForCausalLM"],\n'
    '  "rms_norm_eps": 1e-6,\n'
    '  "rope_theta": 10000.0,\n'
    '  "max_position_embeddings": 64,\n'
    '  "scale": 1.0e2,\n'
    '  "attention_dropout": 0.0,\n'
    '  "initializer_range": 0.02,\n'
    '  "max_z": 1E16,\n'
    '  "min_lr": 0.00001,\n'
    '  "hidden_size": 64,\n'
    '  "rope_scaling": null,\n'
    '  "tie_word_embeddings": true,\n'
    '  "comment": "café \\u2603 \\ud83d\\ude00",\n'
    '  "transformers_version": "4.57.1",\n'
    '  "_name_or_path": "/home/me/model"\n'
    "}\n"
)
GENERATION_JSON = '{"eos_token_id": [1, 2], "max_new_tokens": 8}\n'
TOKENIZER_FILES = {
    "tokenizer.json": '{"model": {"type": "WordLevel", "vocab": {"<pad>": 0, "<eos>": 1, "a": 2}}}\n',
    "tokenizer_config.json": '{"eos_token": "<eos>", "pad_token": "<pad>"}\n',
}
TASK_DATA = b'{"question": "1+1", "answer": "2"}\n{"question": "2+3", "answer": "5"}\n'
DATA_NAME = "problems.jsonl"


def model_dir(root: Path) -> Path:
    """The example model directory's non-weight files, written into ``root``."""
    (root / "config.json").write_text(CONFIG_JSON)
    (root / "generation_config.json").write_text(GENERATION_JSON)
    for name, text in TOKENIZER_FILES.items():
        (root / name).write_text(text)
    return root


def weights_state() -> dict[str, torch.Tensor]:
    """Five small tensors: every width, a scalar, a BOOL, and a non-ASCII name (sorted by UTF-8 bytes)."""
    return {
        "layer.weight": torch.tensor([[1.0, -2.0], [0.5, 0.0]], dtype=torch.bfloat16),
        "bias": torch.tensor([0.25, -1.0], dtype=torch.float32),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "é": torch.tensor([1.0], dtype=torch.float16),
    }


_DTYPE = {
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.int64: "I64",
    torch.bool: "BOOL",
    torch.float16: "F16",
}


def weights_stream(state: dict[str, torch.Tensor]) -> Iterator[tuple[bytes, str]]:
    """§4's byte stream of ``state`` in labelled pieces (written from the spec, beside the module's hash)."""
    yield b"p2prl/weights/v1\x00", "domain, 17 bytes"
    yield struct.pack("<I", len(state)), f"u32le {len(state)} tensors"
    for name in sorted_names(state):
        t = state[name]
        nb, dt = name.encode(), _DTYPE[t.dtype].encode()
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        yield struct.pack("<I", len(nb)) + nb, f"name {name!r}: u32le {len(nb)}, UTF-8"
        yield bytes([len(dt)]) + dt, f"dtype: u8 {len(dt)}, {dt.decode()}"
        dims = struct.pack(f"<{t.dim()}Q", *t.shape)
        yield (
            bytes([t.dim()]) + dims,
            f"ndim {t.dim()}" + (f", dims {list(t.shape)} as u64le" if t.dim() else ""),
        )
        yield struct.pack("<Q", len(raw)), f"u64le nbytes {len(raw)}"
        yield raw, f"data {t.reshape(-1).tolist()}"


def _hexlines(data: bytes) -> list[str]:
    hx = data.hex()
    return [hx[i : i + WRAP] for i in range(0, len(hx), WRAP)] or [""]


def _block(lines: list[str], lang: str = "") -> list[str]:
    return [f"```{lang}", *lines, "```", ""]


def render() -> str:
    """The spec's §9 as Markdown."""
    with tempfile.TemporaryDirectory() as tmp:
        d = model_dir(Path(tmp))
        cfg_hash, tok_hash = config_sha256(d), tokenizer_sha256(d)
        tar = pack_files(d)
        tok_names = present_files(d, tuple(TOKENIZER_FILES))
        canon = json.dumps(
            {
                k: v
                for k, v in json.loads(CONFIG_JSON).items()
                if k not in ("transformers_version", "_name_or_path")
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        members = []
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
            for m in tf.getmembers():
                members.append(f"- `{m.name}`: header at {m.offset}, {m.size} data bytes at {m.offset_data}")
    out = [
        SECTION,
        "",
        "Made by `p2prl/rl/hashexamples.py` (`python -m p2prl.rl.hashexamples` prints this section; a test",
        "keeps the two equal) with the code that computes each hash for a real genesis.",
        "",
        "### `config_sha256`",
        "",
        "`config.json` as read:",
        "",
        *_block(CONFIG_JSON.rstrip("\n").splitlines(), "json"),
        "The text hashed (§3, `config_sha256`: note `1e-06`, `10000.0`, `100.0`, `1e+16`, `1e-05`, `0.02`, the",
        "escapes, and `64` kept an integer):",
        "",
        *_block([canon], "json"),
        f"`config_sha256` = `{cfg_hash}`",
        "",
        "### `tokenizer_sha256`",
        "",
        "The tokenizer files present, in name order, each with the SHA-256 of its bytes:",
        "",
    ]
    pre = b"p2prl/tokenizer/v1\x00"
    for name in tok_names:
        data = TOKENIZER_FILES[name].encode()
        digest = hashlib.sha256(data).digest()
        pre += name.encode() + b"\x00" + digest
        out.append(
            f"- `{name}` ({len(data)} bytes, `{TOKENIZER_FILES[name].rstrip()}` and a newline): `{digest.hex()}`"
        )
    out += [
        "",
        f"The {len(pre)} bytes hashed (domain, then per file: name, `00`, the 32-byte digest):",
        "",
        *_block(_hexlines(pre)),
        f"`tokenizer_sha256` = `{tok_hash}` (= SHA-256 of the bytes above: "
        f"{'yes' if hashlib.sha256(pre).hexdigest() == tok_hash else 'NO'})",
        "",
        "### `files_sha256` (the `model_files` tar)",
        "",
        "The same directory (`config.json`, `generation_config.json` = "
        f"`{GENERATION_JSON.rstrip()}` and a newline, the two tokenizer files) packed (§3): "
        f"{len(tar)} bytes, members",
        "",
        *members,
        "",
        "First header block (512 bytes):",
        "",
        *_block(_hexlines(tar[:512])),
        f"`files_sha256` = `{hashlib.sha256(tar).hexdigest()}`, `files_size` = {len(tar)}",
        "",
    ]
    ref = blob_ref_for(TASK_DATA, MIN_CHUNK_SIZE)
    asset = {"name": "task_data", **ref.to_body()}
    out += [
        "### `data_sha256` (the `task_data` asset)",
        "",
        f"A data file `{DATA_NAME}` of {len(TASK_DATA)} bytes:",
        "",
        *_block(TASK_DATA.decode().rstrip("\n").splitlines()),
        f"`data_sha256` = SHA-256 of the file's bytes = the asset's `id` = `{ref.id}`. "
        "The asset as listed in a genesis whose `patch.chunk_size` is 16384:",
        "",
        *_block([canonical_bytes(asset).decode()], "json"),
        f"Its ref digest (§3) = `{ref.digest}`.",
        "",
    ]
    state = weights_state()
    pieces = list(weights_stream(state))
    stream = b"".join(p for p, _ in pieces)
    width = max(len(p.hex()) for p, _ in pieces)
    out += [
        "### `weights_hash` and `weights_sha256`",
        "",
        f"Five tensors; the §4 stream ({len(stream)} bytes), piece by piece:",
        "",
        *_block([f"{p.hex():<{width}}  {label}" for p, label in pieces]),
        f"`weights_hash` (BLAKE3) = `{weights_hash(state)}`",
        "",
        f"`weights_sha256` (SHA-256 of the same stream; reported by nodes, docs/NODE.md) = `{weights_sha256(state)}`",
    ]
    assert hashlib.sha256(stream).hexdigest() == weights_sha256(state)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
