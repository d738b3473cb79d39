"""docs/PROTOCOL.md §10–§12: the rollout-batch examples are what the code computes, and the written
rules (seed draws, projection bits, Merkle layout, payload layout, the miss table) agree with it."""

import hashlib
import math
import struct
from pathlib import Path

import numpy as np
import zstandard

from p2prl.proof.batch import MAGIC, decode_batch, encode_batch
from p2prl.proof.fingerprint import projection
from p2prl.proof.specexamples import (
    MANIFEST_HASH,
    MINER,
    SECTION,
    example_batch,
    miss_thresholds,
    payload_lines,
    render,
    task_draws,
)
from p2prl.proof.validate import binom_log_sf
from p2prl.rl.tasks.base import derive_seed, seed_ints

SPEC = Path(__file__).parents[2] / "docs" / "PROTOCOL.md"


def section(title: str) -> str:
    text = SPEC.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else len(text)].rstrip("\n")


def test_the_spec_prints_exactly_these_examples() -> None:
    """Regenerate with: python -m p2prl.proof.specexamples."""
    assert section(SECTION) == render().rstrip("\n")


def test_draws_are_the_tasks_own() -> None:
    for i in range(5):
        seed = derive_seed(MANIFEST_HASH, MINER, i)
        assert seed == hashlib.sha256(bytes.fromhex(MANIFEST_HASH) + MINER + i.to_bytes(8, "big")).digest()
        assert task_draws(seed, 13) == seed_ints(seed, 13)


def test_projection_bits_are_msb_first_row_major() -> None:
    import blake3

    d, m = 5, 3  # 15 bits: not a whole number of bytes, not a whole row per byte
    key = b"p2prl-fingerprint-v1" + bytes.fromhex(MANIFEST_HASH) + d.to_bytes(4, "big") + bytes([m])
    raw = blake3.blake3(key).digest(length=2)
    bits = [(raw[b // 8] >> (7 - b % 8)) & 1 for b in range(m * d)]
    want = np.array(
        [[1.0 if bits[r * d + c] else -1.0 for c in range(d)] for r in range(m)], dtype=np.float32
    )
    assert np.array_equal(projection(MANIFEST_HASH, d, m), want)


def test_payload_is_the_layout_written() -> None:
    """The piece-by-piece listing concatenates to the encoder's payload, the blob is the magic and one
    frame of it, and a frame made by another compressor setting decodes to the same batch."""
    batch = example_batch()
    payload = b"".join(bytes.fromhex(line.split()[0]) for line in payload_lines(batch))
    blob = encode_batch(batch)
    assert blob[:5] == MAGIC == b"P2RB\x01"
    assert zstandard.ZstdDecompressor().decompress(blob[5:]) == payload
    other = MAGIC + zstandard.ZstdCompressor(level=19, write_content_size=False).compress(payload)
    back = decode_batch(other)
    assert [g.index for g in back.groups] == [5, 6] and back.n_rollouts == 3
    assert struct.unpack_from("<Q", payload, 0)[0] == batch.version


def test_miss_table_is_the_validators_bound() -> None:
    """§10 corrected: 4 misses only for N 20..126, 5 for 127..417, 6 for 418..962."""
    rows = {(lo, hi): m for lo, hi, m in miss_thresholds(1000)}
    assert rows[(20, 126)] == 4 and rows[(127, 417)] == 5 and rows[(418, 962)] == 6
    for lo, hi, m in miss_thresholds(1000):
        for n in (lo, hi):
            assert binom_log_sf(m, n, 1e-4) < math.log(1e-9) <= binom_log_sf(m - 1, n, 1e-4)
    text = section("## 10. Verifiable sampling")
    assert "4 for\n`N` 20–126, 5 for 127–417, 6 for 418–962" in text and "~600" not in text


def test_section_10_example_figures() -> None:
    """A2: the cumulative mass at T = 0.5 is 0.132901 (not 0.1328); softmax normalises by multiplying
    with the reciprocal of the sum, as §10 step 2 says."""
    import torch

    z = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=torch.float64)
    c = torch.softmax(z / 0.5, -1).cumsum(-1).tolist()
    assert f"{c[1]:.6f}" == "0.132901" and "0.132901" in section("## 10. Verifiable sampling")
    x = (z / 1.0).tolist()
    e = [math.exp(v - max(x)) for v in x]
    assert [v * (1 / sum(e)) for v in e] == torch.softmax(z, -1).tolist()
