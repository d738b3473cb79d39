"""The batch blob: exact round trip, commitment root, and a strict decoder under hostile bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from p2prl.proof.batch import (
    MAGIC,
    BatchError,
    BatchLimits,
    GroupRecord,
    RolloutBatch,
    RolloutRecord,
    commitment_root,
    decode_batch,
    encode_batch,
)

REASONS = {"batch_malformed", "batch_oversized", "batch_vocab"}


def _batch(n_groups: int = 3, n_rollouts: int = 2, n_tok: int = 5, seed: int = 0) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        rolls = [
            RolloutRecord(
                completion_ids=rng.integers(0, 99, n_tok).astype(np.uint32),
                logprobs=-rng.random(n_tok).astype(np.float32),
                reward=float(rng.integers(0, 2)),
                sketches=rng.integers(0, 256, (n_tok, 16)).astype(np.uint8),
            )
            for _ in range(n_rollouts)
        ]
        groups.append(
            GroupRecord(index=g * 7, prompt_ids=rng.integers(3, 99, 6).astype(np.uint32), rollouts=rolls)
        )
    return RolloutBatch(version=9, manifest_hash="ef" * 32, miner=bytes(range(32)), groups=groups)


def _raw(payload: bytes) -> bytes:
    return MAGIC + zstandard.ZstdCompressor().compress(payload)


def test_round_trip_is_exact() -> None:
    b = _batch()
    d = decode_batch(encode_batch(b), BatchLimits(vocab_size=99))
    assert (d.version, d.manifest_hash, d.miner) == (b.version, b.manifest_hash, b.miner)
    for g0, g1 in zip(b.groups, d.groups, strict=True):
        assert g0.index == g1.index and np.array_equal(g0.prompt_ids, g1.prompt_ids)
        for r0, r1 in zip(g0.rollouts, g1.rollouts, strict=True):
            assert np.array_equal(r0.completion_ids, r1.completion_ids)
            assert r0.logprobs.tobytes() == r1.logprobs.tobytes() and r0.reward == r1.reward
            assert np.array_equal(r0.sketches, r1.sketches)
    assert commitment_root(d) == commitment_root(b)
    assert encode_batch(d) == encode_batch(b)


def test_commitment_root_binds_every_sketch() -> None:
    b = _batch()
    root = commitment_root(b)
    b.groups[2].rollouts[1].sketches[4, 15] ^= 1
    assert commitment_root(b) != root


def test_truncation_rejected_clearly() -> None:
    blob = encode_batch(_batch())
    for cut in range(0, len(blob), 7):
        with pytest.raises(BatchError) as e:
            decode_batch(blob[:cut])
        assert e.value.reason in REASONS


def test_truncated_payload_rejected() -> None:
    payload = zstandard.ZstdDecompressor().decompress(encode_batch(_batch())[len(MAGIC) :])
    for cut in (0, 10, 77, len(payload) - 1):
        with pytest.raises(BatchError, match=r"truncated|groups"):
            decode_batch(_raw(payload[:cut]))
    with pytest.raises(BatchError, match="trailing"):
        decode_batch(_raw(payload + b"\x00"))


def test_bit_flips_never_crash() -> None:
    blob = encode_batch(_batch())
    payload = zstandard.ZstdDecompressor().decompress(blob[len(MAGIC) :])
    rng = np.random.default_rng(1)
    for _ in range(300):
        for data, wrap in ((blob, False), (payload, True)):
            buf = bytearray(data)
            i = int(rng.integers(0, len(buf)))
            buf[i] ^= 1 << int(rng.integers(0, 8))
            try:
                decode_batch(_raw(bytes(buf)) if wrap else bytes(buf), BatchLimits(vocab_size=99))
            except BatchError as e:
                assert e.reason in REASONS


def test_oversized_counts_rejected_before_allocation() -> None:
    head = struct.pack("<Q32s32sBI", 1, b"\x00" * 32, b"\x00" * 32, 16, 1)
    with pytest.raises(BatchError) as e:
        decode_batch(_raw(struct.pack("<Q32s32sBI", 1, b"\x00" * 32, b"\x00" * 32, 16, 2**32 - 1)))
    assert e.value.reason == "batch_oversized"
    for group in (struct.pack("<QII", 0, 2**31, 1), struct.pack("<QII", 0, 1, 2**31)):
        with pytest.raises(BatchError) as e:
            decode_batch(_raw(head + group + b"\x05\x00\x00\x00"))
        assert e.value.reason == "batch_oversized"
    rollout = struct.pack("<QII", 0, 1, 1) + b"\x05\x00\x00\x00" + struct.pack("<Id", 2**30, 0.0)
    with pytest.raises(BatchError) as e:
        decode_batch(_raw(head + rollout))
    assert e.value.reason == "batch_oversized"
    with pytest.raises(BatchError) as e:
        decode_batch(encode_batch(_batch(n_groups=5)), BatchLimits(max_groups=4))
    assert e.value.reason == "batch_oversized"
    with pytest.raises(BatchError) as e:
        decode_batch(encode_batch(_batch(n_tok=50)), BatchLimits(max_total_tokens=100))
    assert e.value.reason == "batch_oversized"


def test_decompression_bomb_rejected() -> None:
    bomb = MAGIC + zstandard.ZstdCompressor().compress(b"\x00" * (2 << 20))
    with pytest.raises(BatchError) as e:
        decode_batch(bomb, BatchLimits(max_decoded_bytes=1 << 20))
    assert e.value.reason == "batch_oversized"


def test_values_checked() -> None:
    with pytest.raises(BatchError) as e:
        decode_batch(encode_batch(_batch()), BatchLimits(vocab_size=50))
    assert e.value.reason == "batch_vocab"
    b = _batch()
    b.groups[0].rollouts[0].logprobs[1] = np.nan
    with pytest.raises(BatchError, match="logprobs"):
        decode_batch(encode_batch(b))
    b = _batch()
    b.groups[0].rollouts[0].reward = float("inf")
    with pytest.raises(BatchError, match="reward"):
        decode_batch(encode_batch(b))
    with pytest.raises(BatchError, match="sketch_dim"):
        decode_batch(encode_batch(_batch()), BatchLimits(sketch_dim=8))
    with pytest.raises(BatchError, match="magic"):
        decode_batch(b"XXXX" + encode_batch(_batch())[4:])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_give_batch_error(data: bytes) -> None:
    for blob in (data, MAGIC + data, _raw(data)):
        try:
            decode_batch(blob)
        except BatchError as e:
            assert e.reason in REASONS
