"""Scores: valid unique rollouts over a sliding window, zeroed while a hard failure lies in it."""

from __future__ import annotations

import pytest

from p2prl.proof.scores import ScoreBook
from p2prl.protocol.messages import Scores

A, B = "aa" * 32, "bb" * 32


def test_window_sums_and_slides() -> None:
    s = ScoreBook(window=3)
    for v in (1, 2, 3):
        s.record(A, v, 10)
    assert s.score(A) == 30
    s.record(B, 4, 5)
    assert s.score(A) == 20 and s.score(B) == 5  # version 1 left the window
    assert s.score("cc" * 32) == 0


def test_hard_failure_zeroes_window_until_it_slides_out() -> None:
    s = ScoreBook(window=3)
    s.record(A, 1, 10)
    s.record(A, 2, 10)
    s.record(A, 2, 0, hard_failure=True)
    s.record(A, 3, 10)
    s.record(B, 3, 7)
    assert s.score(A) == 0 and s.score(B) == 7
    s.record(A, 4, 10)
    assert s.score(A) == 0
    s.record(A, 5, 10)
    assert s.score(A) == 30  # versions 3..5, the failure at 2 has left


def test_bounded_and_message() -> None:
    s = ScoreBook(window=2, max_miners=2)
    s.record(A, 1, 1)
    s.record(B, 1, 2)
    s.record("cc" * 32, 1, 3)
    assert A not in s.scores()
    msg = s.to_message()
    assert isinstance(msg, Scores) and Scores.from_body(msg.to_body()).scores == {B: 2, "cc" * 32: 3}
    with pytest.raises(ValueError):
        s.record(A, 1, -1)
    with pytest.raises(ValueError):
        ScoreBook(window=0)
