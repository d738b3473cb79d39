"""The upload cap: reservations at the configured rate, bursts bounded, overbooking refused."""

from __future__ import annotations

import pytest

from p2prl.net.pacing import UploadPacer


def test_reservations_follow_the_rate() -> None:
    p = UploadPacer(1_000_000, burst_bytes=100_000, max_wait_s=10.0)
    t = p.last
    assert p.reserve(100_000, now=t) == 0.0  # the burst
    assert p.reserve(1_000_000, now=t) == pytest.approx(1.0)  # then one second per MB
    assert p.reserve(500_000, now=t) == pytest.approx(1.5)  # queued behind the first
    # time passing pays the debt back; the bucket never holds more than the burst
    assert p.reserve(0, now=t + 1.5) == 0.0
    assert p.reserve(200_000, now=t + 100.0) == pytest.approx(0.1)


def test_overbooking_is_refused_and_reserves_nothing() -> None:
    p = UploadPacer(1_000_000, burst_bytes=0, max_wait_s=2.0)
    t = p.last
    assert p.reserve(1_500_000, now=t) == pytest.approx(1.5)
    assert p.reserve(1_000_000, now=t) is None  # would wait 2.5 s: answer BUSY instead
    assert p.reserve(400_000, now=t) == pytest.approx(1.9)  # the refusal cost nothing


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        UploadPacer(0)
