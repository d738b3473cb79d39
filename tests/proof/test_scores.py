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


def test_sybil_keys_do_not_evict_miners_with_valid_work() -> None:
    """Item 11: 4,096 keys whose batches failed must not push a miner with valid work out of the book."""
    s = ScoreBook(window=8)
    s.record(A, 3, 10)
    for i in range(4096):
        s.record(f"{i:064x}", 3, 0, True)
    assert s.score(A) == 10


def test_claimed_version_does_not_move_the_window() -> None:
    """Item 3: a batch claiming a far version counts for nothing when the validator's version is given."""
    s = ScoreBook(window=3)
    s.record(A, 5, 10, current=5)
    s.record(B, 2**40, 0, current=5)
    s.record(B, 1, 4, current=5)  # older than the window
    assert s.latest == 5 and s.scores() == {A: 10}


def test_a_book_taken_back_keeps_its_scores_and_hard_failures() -> None:
    """What a restarted validator takes back: the same scores, a hard failure still zeroing its
    miner, the window sliding on from there; entries that are not well formed skipped."""
    s = ScoreBook(window=3)
    s.record(A, 1, 10)
    s.record(A, 2, 5)
    s.record(B, 2, 7)
    s.record(B, 2, 0, hard_failure=True)
    state = s.state()
    state["miners"] += [["zz", {}, []], ["cc" * 32, {"x": 1, "2": -3}, ["1"]], 7]
    again = ScoreBook(window=3)
    assert again.restore(state) == 3
    assert again.scores() == {A: 15, B: 0, "cc" * 32: 0}
    again.record(A, 4, 1)  # v1 leaves the window
    assert again.score(A) == 6 and again.score(B) == 0
    again.record(A, 5, 1)
    assert again.score(B) == 0 and again.score(A) == 2
    assert ScoreBook(window=3).restore({"latest": "x"}) == 0
