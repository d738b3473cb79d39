import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2prl.crypto.envelope import EnvelopeError, open_envelope, seal
from p2prl.crypto.keys import Identity
from p2prl.crypto.replay import ReplayGuard

ALICE = Identity(b"\x01" * 32)
MALLORY = Identity(b"\x02" * 32)


def test_seal_open_roundtrip():
    raw = seal(ALICE, "net1", "heartbeat", {"x": 1, "created_ms": 5})
    env = open_envelope(raw, "net1")
    assert (
        env.type == "heartbeat" and env.signer == ALICE.public_key and env.body == {"x": 1, "created_ms": 5}
    )


def reason(fn):
    with pytest.raises(EnvelopeError) as e:
        fn()
    return e.value.reason


def test_rejections_have_reasons():
    raw = seal(ALICE, "net1", "heartbeat", {"x": 1})
    assert reason(lambda: open_envelope(raw, "net2")) == "bad_signature"  # other network
    assert reason(lambda: open_envelope(raw[:-1], "net1")) == "truncated"
    assert reason(lambda: open_envelope(raw + b"\x00", "net1")) == "trailing_bytes"
    assert reason(lambda: open_envelope(raw, "net1", max_bytes=10)) == "oversized"
    assert reason(lambda: open_envelope(b"XXXX" + raw[4:], "net1")) == "bad_magic"
    assert reason(lambda: open_envelope(raw, "net1", expected_type="verdict")) == "unexpected_type"
    assert (
        reason(lambda: open_envelope(raw, "net1", allowed_signers={MALLORY.public_key})) == "unknown_signer"
    )
    # body tampered after signing
    tampered = raw.replace(b'"x":1', b'"x":2')
    assert reason(lambda: open_envelope(tampered, "net1")) == "bad_signature"
    # signer swapped: signature no longer verifies
    swapped = raw[: 5 + 9] + MALLORY.public_key + raw[5 + 9 + 32 :]
    assert reason(lambda: open_envelope(swapped, "net1")) == "bad_signature"
    # type swapped to another valid type of the same length
    retyped = raw.replace(b"heartbeat", b"xeartbeat", 1)
    assert reason(lambda: open_envelope(retyped, "net1")) == "bad_signature"


def test_unsigned_and_non_canonical_body():
    body = b'{"x": 1}'
    t = b"heartbeat"
    sig_input = b"p2prl/envelope/v1\x00" + bytes([4]) + b"net1" + bytes([len(t)]) + t + body
    raw = b"P2E\x01" + bytes([len(t)]) + t + ALICE.public_key + struct.pack(">I", len(body)) + body
    assert reason(lambda: open_envelope(raw + b"\x00" * 64, "net1")) == "bad_signature"
    # validly signed but non-canonical body is still refused
    assert reason(lambda: open_envelope(raw + ALICE.sign(sig_input), "net1")) == "bad_body"


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_fuzz_never_crashes(data):
    try:
        open_envelope(data, "net1")
    except EnvelopeError:
        pass


@settings(max_examples=200)
@given(st.integers(0, 10_000), st.integers(0, 7))
def test_bitflips_always_rejected(pos, bit):
    raw = bytearray(seal(ALICE, "net1", "verdict", {"blob": "ab" * 32, "n": 3}))
    pos %= len(raw)
    raw[pos] ^= 1 << bit
    with pytest.raises(EnvelopeError):
        open_envelope(bytes(raw), "net1")


def test_seal_rejects_bad_input():
    assert reason(lambda: seal(ALICE, "net1", "Bad-Type", {})) == "bad_type"
    assert reason(lambda: seal(ALICE, "net1", "t", {"f": 1.5})) == "bad_body"
    assert reason(lambda: seal(ALICE, "", "t", {})) == "bad_network"


def test_replay_guard():
    g = ReplayGuard(max_age_s=10, max_skew_s=1, capacity=2)
    now = int(time.time() * 1000)
    envs = [open_envelope(seal(ALICE, "n", "heartbeat", {"created_ms": now, "i": i}), "n") for i in range(3)]
    g.check(envs[0], now_ms=now)
    assert reason(lambda: g.check(envs[0], now_ms=now)) == "replayed"
    old = open_envelope(seal(ALICE, "n", "heartbeat", {"created_ms": now - 20_000}), "n")
    assert reason(lambda: g.check(old, now_ms=now)) == "stale"
    fut = open_envelope(seal(ALICE, "n", "heartbeat", {"created_ms": now + 5_000}), "n")
    assert reason(lambda: g.check(fut, now_ms=now)) == "future"
    nots = open_envelope(seal(ALICE, "n", "heartbeat", {}), "n")
    assert reason(lambda: g.check(nots, now_ms=now)) == "bad_body"
    g.check(envs[1], now_ms=now)
    g.check(envs[2], now_ms=now)
    assert len(g._seen) == 2  # bounded


def test_replay_recognised_after_a_many_key_flood():
    """Item 25: envelopes from 1,000 fresh keys fill the guard's memory (shrunk to 64); a replay of
    an earlier honest envelope, still inside the age window, must be refused (an LRU forgot it and
    let it through), while envelopes created after the flood still pass."""
    g = ReplayGuard(max_age_s=600, max_skew_s=60, capacity=64)
    now = int(time.time() * 1000)
    honest = open_envelope(seal(ALICE, "n", "rollout", {"created_ms": now, "i": 0}), "n")
    g.check(honest, now_ms=now)
    for i in range(1000):
        junk = open_envelope(
            seal(Identity.generate(), "n", "rollout", {"created_ms": now + 1 + i // 10}), "n"
        )
        g.check(junk, now_ms=now + 1 + i // 10)
    later = now + 30_000
    assert reason(lambda: g.check(honest, now_ms=later)) in ("replayed", "stale")
    assert len(g._seen) == 64
    fresh = open_envelope(seal(ALICE, "n", "rollout", {"created_ms": later, "i": 1}), "n")
    g.check(fresh, now_ms=later)
    assert reason(lambda: g.check(fresh, now_ms=later + 1)) == "replayed"


def test_replay_memory_expires_with_the_window():
    g = ReplayGuard(max_age_s=10, max_skew_s=1, capacity=4)
    now = int(time.time() * 1000)
    for i in range(4):
        g.check(open_envelope(seal(ALICE, "n", "heartbeat", {"created_ms": now, "i": i}), "n"), now_ms=now)
    g.check(
        open_envelope(seal(ALICE, "n", "heartbeat", {"created_ms": now + 11_000}), "n"), now_ms=now + 11_000
    )
    assert len(g._seen) == 1 and g.watermark == -1  # the old ones left with their window, not over the bound


def test_framing_is_checked_before_the_type():
    """The documented order: size, magic, framing, type — a truncated envelope is `truncated`
    whatever its type bytes say."""
    raw = bytearray(seal(Identity.generate(), "net", "heartbeat", {"a": 1}))
    raw[5] = ord("!")  # a type byte outside [a-z0-9_]
    with pytest.raises(EnvelopeError) as e:
        open_envelope(bytes(raw[:-1]), "net")
    assert e.value.reason == "truncated"
    with pytest.raises(EnvelopeError) as e:
        open_envelope(bytes(raw), "net")
    assert e.value.reason == "bad_type"
