import itertools
import json
import random
import struct

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patch_testutil import bits_equal, perturb, random_state, snapshot

from p2prl.patch import (
    PatchApplier,
    PatchEncoder,
    PatchError,
    apply_patch,
    encode_patch,
    inspect_patch,
    weights_hash,
)
from p2prl.patch.dtypes import uint_view
from p2prl.patch.format import PREAMBLE, SEGMENT, SegmentHead

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _pair(shapes, dtype, density, seed=0, ulps=True):
    base = random_state(shapes, dtype, seed)
    return base, perturb(base, density, seed + 1, ulps)


def _roundtrip(base, new, **kw):
    before = snapshot(base)
    enc = PatchEncoder(base, new, **kw)
    patch = b"".join(enc.segments())
    out = apply_patch(base, patch)
    assert bits_equal(out, new)
    assert bits_equal(base, before), "apply modified its base"
    assert enc.result_hash == weights_hash(new)
    return patch


shapes_st = st.dictionaries(
    st.text("abcxyzé._", min_size=1, max_size=6),
    st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=shapes_st,
    dtype=st.sampled_from(DTYPES),
    density=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
    ulps=st.booleans(),
    span=st.sampled_from([7, 64, 1 << 22]),
    coding=st.sampled_from(["u16esc", "leb128", "auto"]),
    seed=st.integers(0, 1000),
)
def test_roundtrip_is_bit_exact(shapes, dtype, density, ulps, span, coding, seed):
    base, new = _pair(shapes, dtype, density, seed, ulps)
    _roundtrip(base, new, segment_span=span, index_coding=coding)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_changed_element(dtype):
    base = random_state({"w": (300, 17), "b": (17,)}, dtype)
    new = snapshot(base)
    uint_view(new["w"])[4321] ^= 1
    patch = _roundtrip(base, new)
    info = inspect_patch(patch)
    assert info["changed"] == 1 and info["segments"] == 1


def test_dense_and_sparse_segments_and_streaming_any_split():
    base, new = _pair({"dense": (50, 40), "sparse": (100, 100), "same": (10,)}, torch.bfloat16, 0.0)
    new["dense"] = perturb({"d": base["dense"]}, 0.9)["d"]
    new["sparse"] = perturb({"s": base["sparse"]}, 0.01)["s"]
    patch = _roundtrip(base, new, segment_span=1000)
    info = inspect_patch(patch)
    json.dumps(info)
    per = {t["name"]: t for t in info["tensors"]}
    assert per["dense"]["dense_segments"] == 2 and per["sparse"]["dense_segments"] == 0
    assert per["same"]["changed"] == 0
    assert info["changed"] == sum(int((uint_view(base[k]) != uint_view(new[k])).sum()) for k in base)
    rng = random.Random(0)
    for _ in range(5):
        a = PatchApplier(base)
        pos = 0
        while pos < len(patch):
            n = rng.randint(0, 300)
            a.feed(patch[pos : pos + n])
            pos += n
        assert bits_equal(a.finish(), new)


def test_fifty_link_chain_is_bit_exact():
    shapes = {"w": (64, 48), "v": (200,), "h": (8, 8)}
    state = random_state(shapes, torch.bfloat16)
    states = [state]
    for i in range(50):
        states.append(perturb(states[-1], 0.05, seed=100 + i))
    cur = states[0]
    for prev, nxt in itertools.pairwise(states):
        cur = apply_patch(cur, encode_patch(prev, nxt), base_hash=weights_hash(prev))
    assert bits_equal(cur, states[-1])


def test_staging_buffer_receives_the_whole_result():
    base, new = _pair({"a": (30, 30), "b": (5,)}, torch.float32, 0.02)
    new["b"] = base["b"].clone()  # untouched tensor must still be copied into staging
    spare = {k: torch.full_like(v, 7.0) for k, v in base.items()}
    out = apply_patch(base, encode_patch(base, new), staging=spare)
    assert bits_equal(out, new)
    assert all(out[k].data_ptr() == spare[k].data_ptr() for k in out)


def test_wrong_base_rejected_before_anything_is_applied():
    base, new = _pair({"w": (20, 20)}, torch.bfloat16, 0.1)
    other = perturb(base, 0.01, seed=9)
    patch = encode_patch(base, new)
    keep = snapshot(other)
    with pytest.raises(PatchError, match="wrong base"):
        apply_patch(other, patch)
    assert bits_equal(other, keep)
    with pytest.raises(PatchError, match="base does not match"):
        apply_patch({"w": base["w"].float()}, patch)
    with pytest.raises(PatchError, match="base does not match"):
        apply_patch({"w": base["w"], "x": base["w"]}, patch)


def test_encoder_rejects_mismatched_states():
    a = random_state({"w": (3, 3)})
    with pytest.raises(PatchError):
        encode_patch(a, {"w": a["w"].reshape(9)})


# -- hostile patches ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_case():
    base, new = _pair({"w": (40, 30), "b": (30,), "n": (7,)}, torch.bfloat16, 0.05)
    new["n"] = perturb({"n": base["n"]}, 1.0)["n"]
    return base, snapshot(base), encode_patch(base, new)


def _must_reject(base, keep, data):
    with pytest.raises(PatchError):
        apply_patch(base, data)
    assert bits_equal(base, keep)


def test_every_truncation_rejected(fuzz_case):
    base, keep, patch = fuzz_case
    for n in range(len(patch)):
        _must_reject(base, keep, patch[:n])
    with pytest.raises(PatchError):
        apply_patch(base, patch + b"\0")


def test_bit_flips_rejected(fuzz_case):
    base, keep, patch = fuzz_case
    rng = random.Random(1)
    positions = list(range(min(len(patch), 400))) + [rng.randrange(len(patch)) for _ in range(300)]
    for p in positions:
        bad = bytearray(patch)
        bad[p] ^= 1 << rng.randrange(8)
        _must_reject(base, keep, bytes(bad))


def test_random_bytes_rejected(fuzz_case):
    base, keep, patch = fuzz_case
    rng = random.Random(2)
    for n in (0, 1, 9, 10, 100, 5000):
        _must_reject(base, keep, rng.randbytes(n))
        _must_reject(base, keep, patch[:60] + rng.randbytes(n))
    for bad in (rng.randbytes(len(patch)) for _ in range(20)):
        _must_reject(base, keep, bad)


def _header_end(patch):
    _, _, hlen = PREAMBLE.unpack(patch[: PREAMBLE.size])
    return PREAMBLE.size + hlen


def _first_segment(patch):
    off = _header_end(patch)
    f = SEGMENT.unpack(patch[off : off + SEGMENT.size])
    return off, SegmentHead(f[0], f[1], f[2], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11])


def test_zstd_bombs_and_lying_frames_rejected(fuzz_case):
    base, keep, patch = fuzz_case
    off, seg = _first_segment(patch)
    body = off + SEGMENT.size
    # a value frame that expands to 64 MiB of zeros; and the same frame whose header claims
    # exactly the segment's value size (a lying frame)
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    lying = bytearray(bomb)
    fhd = lying[4]
    assert fhd >> 6 == 2  # 4-byte content size field
    at = 5 + (0 if fhd & 0x20 else 1)
    lying[at : at + 4] = seg.value_raw.to_bytes(4, "little")
    assert zstandard.get_frame_parameters(bytes(lying)).content_size == seg.value_raw
    for variant in (bomb, bytes(lying)):
        head = SegmentHead(**{**seg.__dict__, "value_len": len(variant)})
        bad = patch[:off] + head.pack() + patch[body : body + seg.index_len] + variant
        _must_reject(base, keep, bad)
    # a frame without a content size, and one whose declared size differs from the segment's
    raw = patch[body + seg.index_len : body + seg.payload_len]
    plain = zstandard.ZstdDecompressor().decompress(raw)
    for frame in (
        zstandard.ZstdCompressor(write_content_size=False).compress(plain),
        zstandard.ZstdCompressor().compress(plain + b"\0\0"),
        zstandard.ZstdCompressor().compress(plain) + b"x",
    ):
        head = SegmentHead(**{**seg.__dict__, "value_len": len(frame)})
        _must_reject(
            base,
            keep,
            patch[:off]
            + head.pack()
            + patch[body : body + seg.index_len]
            + frame
            + patch[body + seg.payload_len :],
        )


def test_oversized_declarations_rejected(fuzz_case):
    base, keep, patch = fuzz_case
    off, seg = _first_segment(patch)
    rest = patch[off + SEGMENT.size :]
    for field, value in (
        ("count", 2**32 - 1),
        ("span", 2**32 - 1),
        ("start", 2**63),
        ("tensor", 2**31),
        ("index_len", 2**32 - 1),
        ("value_len", 2**32 - 1),
        ("index_raw", 2**32 - 1),
        ("value_raw", 2**32 - 1),
        ("kind", 7),
        ("value_coding", 9),
        ("index_coding", 9),
    ):
        head = SegmentHead(**{**seg.__dict__, field: value})
        _must_reject(base, keep, patch[:off] + head.pack() + rest)
    # a header declaring more bytes than any header may have, or absurd tensors
    _must_reject(base, keep, PREAMBLE.pack(b"P2PT", 1, 2**32 - 1) + patch[PREAMBLE.size :])
    _must_reject(base, keep, PREAMBLE.pack(b"P2PT", 2, 10) + patch[PREAMBLE.size :])
    hdr = json.loads(patch[PREAMBLE.size : _header_end(patch)])
    for mutate in (
        lambda h: h["tensors"].__setitem__(0, ["w", "BF16", [2**41, 2**41]]),
        lambda h: h["tensors"].extend([[f"z{i}", "BF16", [1]] for i in range(70000)]),
        lambda h: h["tensors"].__setitem__(0, ["x" * 5000, "BF16", [1]]),
        lambda h: h["tensors"].__setitem__(0, ["w", "F8", [1]]),
        lambda h: h.__setitem__("codec", "other"),
    ):
        h = json.loads(json.dumps(hdr))
        mutate(h)
        body = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
        _must_reject(base, keep, PREAMBLE.pack(b"P2PT", 1, len(body)) + body + patch[_header_end(patch) :])


def test_applier_is_dead_after_an_error(fuzz_case):
    base, _, patch = fuzz_case
    a = PatchApplier(base)
    with pytest.raises(PatchError):
        a.feed(b"XXXX" + patch[4:])
    with pytest.raises(PatchError):
        a.feed(patch)
    with pytest.raises(PatchError):
        a.finish()


def test_inspect_rejects_malformed(fuzz_case):
    _, _, patch = fuzz_case
    for bad in (patch[:-1], patch + b"\0", b"", b"P2PT" + b"\0" * 20):
        with pytest.raises(PatchError):
            inspect_patch(bad)
    assert inspect_patch(patch)["result_hash"] == weights_hash(apply_patch(fuzz_case[0], patch))


def test_declared_end_count_must_match(fuzz_case):
    base, keep, patch = fuzz_case
    (n,) = struct.unpack("<I", patch[-68:-64])
    assert n == inspect_patch(patch)["segments"]
    _must_reject(base, keep, patch[:-68] + struct.pack("<I", n + 1) + patch[-64:])


# -- checking without applying, then writing the recorded changes -----------------------------


def _check(base, patch, record):
    applier = PatchApplier(base, verify_only=True, record=record)
    applier.feed(patch)
    assert applier.finish() == {}
    return applier.result_hash


def _xor_in(state, record):
    names = sorted(state, key=lambda s: s.encode("utf-8"))
    for ti, start, pos, bits in record:
        v = uint_view(state[names[ti]])
        if pos is None:
            v[start : start + bits.size] ^= bits
        else:
            v[start:][pos] ^= bits


@pytest.mark.parametrize("chunk", [5, 1 << 20])
@pytest.mark.parametrize("density", [0.01, 0.6])
@pytest.mark.parametrize("inflight", [0, 8])
@pytest.mark.parametrize(("piece_bytes", "hash_threads"), [(14, 1), (1 << 21, 1), (14, 2)])
def test_verify_only_records_what_apply_writes(monkeypatch, chunk, density, inflight, piece_bytes, hash_threads):
    """The check decodes each segment once on a worker (``inflight`` segments ahead of the hash at
    most) and hashes the result in order (on one BLAKE3 thread or several: the same hash), patched a
    piece of ``piece_bytes`` at a time (7 elements: changes fall on both sides of each cut); it
    records the changed bits; XOR-ing them into the base is the result; no worker thread outlives
    the check."""
    import threading

    import p2prl.patch.apply as apply_mod

    monkeypatch.setattr(apply_mod, "FINALISE_CHUNK", chunk)
    monkeypatch.setattr(apply_mod, "CHECK_INFLIGHT", inflight)
    monkeypatch.setattr(apply_mod, "CHECK_CHUNK_BYTES", piece_bytes)
    monkeypatch.setattr(apply_mod, "CHECK_HASH_THREADS", hash_threads)
    base, new = _pair({"w": (40, 30), "b": (30,), "n": (7,), "z": (3, 3)}, torch.bfloat16, density)
    new["z"] = base["z"].clone()  # untouched
    patch = b"".join(PatchEncoder(base, new, segment_span=64).segments())
    keep, record = snapshot(base), []
    assert _check(base, patch, record) == weights_hash(new)
    assert bits_equal(base, keep), "the check wrote into its base"
    assert record and any(r[2] is None for r in record) == (density > 0.25)
    _xor_in(base, record)
    assert bits_equal(base, new)
    assert not [t for t in threading.enumerate() if t.name.startswith("p2prl-check")]


def test_verify_only_rejects_every_bit_flip_and_truncation(fuzz_case):
    base, keep, patch = fuzz_case
    rng = random.Random(2)
    for p in [*range(0, len(patch), 3), *(rng.randrange(len(patch)) for _ in range(200))]:
        bad = bytearray(patch)
        bad[p] ^= 1 << rng.randrange(8)
        for data in (bytes(bad), patch[:p]):
            with pytest.raises(PatchError):
                _check(base, data, [])
    assert bits_equal(base, keep)


@pytest.mark.parametrize("density", [0.02, 0.5])
def test_a_decode_only_check_records_what_the_hashed_one_does_and_vouches_for_no_result(density):
    """``hash_result=False`` (a miner hashes after its switch): the same record and values as the
    hashed check, from the caller's integer views too; a patch of other weights under the same
    promise passes it (only the result's hash tells), while every corrupted byte still fails."""
    base, new = _pair({"w": (40, 30), "b": (30,), "n": (7,)}, torch.bfloat16, density)
    patch = b"".join(PatchEncoder(base, new, segment_span=64).segments())
    views = {k: uint_view(v) for k, v in base.items()}
    out = {}
    for hashed in (True, False):
        record, values = [], []
        applier = PatchApplier(
            base, verify_only=True, record=record, values=values, hash_result=hashed, base_views=views
        )
        applier.feed(patch)
        assert applier.finish() == {} and applier.result_hash == weights_hash(new)
        out[hashed] = (record, values)
    (r1, v1), (r2, v2) = out[True], out[False]
    assert len(r1) == len(r2) and len(v1) == len(v2)
    for a, b in zip([*r1, *v1], [*r2, *v2], strict=True):
        assert all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    other = perturb(base, density, 9, True)
    forged = b"".join(PatchEncoder(base, other, segment_span=64, result_hash=weights_hash(new)).segments())
    decode_only = PatchApplier(base, verify_only=True, hash_result=False)
    decode_only.feed(forged)
    decode_only.finish()  # decodes: it vouches for the patch, not for its result
    hashed_check = PatchApplier(base, verify_only=True)
    hashed_check.feed(forged)
    with pytest.raises(PatchError):
        hashed_check.finish()
    bad = bytearray(patch)
    bad[len(patch) // 2] ^= 0x10
    with pytest.raises(PatchError):
        broken = PatchApplier(base, verify_only=True, hash_result=False)
        broken.feed(bytes(bad))
        broken.finish()
