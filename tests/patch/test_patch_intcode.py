import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from p2prl.patch import intcode
from p2prl.patch.errors import PatchError

UINTS = [np.uint8, np.uint16, np.uint32, np.uint64]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(UINTS).flatmap(lambda dt: st.tuples(*(hnp.arrays(dt, 50) for _ in range(2)))))
def test_zigzag_roundtrip_is_exact(pair):
    old, new = pair
    z = intcode.zigzag_diff(new, old)
    assert z.dtype == new.dtype
    assert np.array_equal(intcode.unzigzag_add(old, z), new)


def test_zigzag_small_steps_are_small_codes():
    old = np.array([100, 100, 100, 0, 65535], dtype=np.uint16)
    new = np.array([101, 99, 100, 65535, 0], dtype=np.uint16)
    assert intcode.zigzag_diff(new, old).tolist() == [2, 1, 0, 1, 2]


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.uint32, st.integers(0, 200), elements=st.integers(0, 2**32 - 1)))
def test_gap_codings_roundtrip(g):
    for enc, dec in (
        (intcode.leb128_encode, intcode.leb128_decode),
        (intcode.u16esc_encode, intcode.u16esc_decode),
    ):
        assert np.array_equal(dec(enc(g), g.size), g)


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 10**6), max_size=300))
def test_positions_gaps_roundtrip(s):
    pos = np.array(sorted(s), dtype=np.int64)
    g = intcode.positions_to_gaps(pos)
    assert np.array_equal(intcode.gaps_to_positions(g, 10**6 + 1), pos)


def test_positions_outside_span_rejected():
    g = intcode.positions_to_gaps(np.array([5, 9]))
    with pytest.raises(PatchError):
        intcode.gaps_to_positions(g, 9)


@pytest.mark.parametrize(
    "buf,n",
    [
        (b"\x80", 1),  # unterminated
        (b"\x01\x02", 1),  # too many values
        (b"\x80\x80\x80\x80\x80\x01", 1),  # six bytes
        (b"\xff\xff\xff\xff\x7f", 1),  # 35 bits
        (b"\x81\x00", 1),  # not minimal
        (b"", 1),
    ],
)
def test_leb128_rejects_malformed(buf, n):
    with pytest.raises(PatchError):
        intcode.leb128_decode(buf, n)


def test_u16esc_rejects_malformed():
    good = intcode.u16esc_encode(np.array([1, 70000, 3], dtype=np.uint32))
    for bad in (good[:-1], good + b"\0", good[:4]):
        with pytest.raises(PatchError):
            intcode.u16esc_decode(bad, 3)
    small_escape = intcode.shuffle(np.array([0xFFFF], dtype=np.uint16)) + (5).to_bytes(4, "little")
    with pytest.raises(PatchError):
        intcode.u16esc_decode(small_escape, 1)


@pytest.mark.parametrize("dt", UINTS)
def test_shuffle_roundtrip(dt):
    a = (np.arange(1000, dtype=np.uint64) * 2654435761).astype(dt)
    assert np.array_equal(intcode.unshuffle(intcode.shuffle(a), dt, a.size), a)
    with pytest.raises(PatchError):
        intcode.unshuffle(intcode.shuffle(a)[:-1], dt, a.size)


@pytest.mark.parametrize("dt", UINTS)
def test_unshuffle_planes_are_the_byte_transpose(dt):
    """The plane-widening decode reads the wire layout (byte k of every element, k = 0..w-1) exactly
    as the byte transpose it replaced."""
    rng = np.random.default_rng(7)
    w = np.dtype(dt).itemsize
    raw = rng.integers(0, 256, size=777 * w, dtype=np.uint8).tobytes()
    want = np.ascontiguousarray(np.frombuffer(raw, np.uint8).reshape(w, 777).T).view(dt).reshape(-1)
    got = intcode.unshuffle(raw, dt, 777)
    assert got.dtype == dt and np.array_equal(got, want)


def test_u16esc_decode_keeps_uint16_without_escapes_and_refuses_a_missing_section():
    g = np.array([0, 5, 0xFFFE, 7], dtype=np.uint32)
    got = intcode.u16esc_decode(intcode.u16esc_encode(g), g.size)
    assert got.dtype == np.uint16 and np.array_equal(got, g)
    assert np.array_equal(intcode.gaps_to_positions(got, 1 << 17), intcode.gaps_to_positions(g, 1 << 17))
    escaped_without_section = intcode.shuffle(np.array([3, 0xFFFF], dtype=np.uint16))
    with pytest.raises(PatchError):
        intcode.u16esc_decode(escaped_without_section, 2)
