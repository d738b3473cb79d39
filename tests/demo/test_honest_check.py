"""The demo's honest check fails on what a rollout holds, never on when it arrived.

On a loaded machine the validator's 3 s probe misses honest batches (``unreachable``) and the next
batch of that version follows an unjudged one (``index_gap``): in three runs of
tests/demo/test_demo_honest.py at load 16, 96 groups each time. Those are counted, not failed on;
a ``sampling`` or ``fingerprint`` rejection of an honest miner still fails the check."""

from p2prl.demo.launcher import TIMING_REJECTIONS, honest_check
from p2prl.reasons import HARD_FAILURES

MINERS = [{"name": "miner1", "score": 40}, {"name": "miner2", "score": 3}]


def test_timing_rejections_are_counted_not_failed_on() -> None:
    c = honest_check(MINERS, {"stale": 288, "unreachable": 96, "index_gap": 32})
    assert c["ok"], c
    assert "(timing: index_gap 32, stale 288, unreachable 96)" in c["detail"]
    assert honest_check(MINERS, {})["detail"] == "honest miners: nothing rejected for its content, every score > 0"


def test_a_content_rejection_or_a_zero_score_fails() -> None:
    assert not honest_check(MINERS, {"stale": 2, "sampling": 16})["ok"]
    assert not honest_check(MINERS, {"distribution": 1})["ok"]
    assert not honest_check([*MINERS, {"name": "miner3", "score": 0}], {"stale": 2})["ok"]
    assert not TIMING_REJECTIONS & HARD_FAILURES


def test_with_a_dishonest_miner_only_the_honest_ones_verdicts_are_judged() -> None:
    miners = [
        {"name": "miner1", "score": 40, "rejections": {"unreachable": 16, "index_gap": 16}},
        {"name": "miner2", "score": 0, "honest": False, "rejections": {"fingerprint": 16}},
    ]
    assert honest_check(miners, {"fingerprint": 16, "unreachable": 16})["ok"]
    miners[0]["rejections"] = {"logprob": 16}
    c = honest_check(miners, {"fingerprint": 16, "logprob": 16})
    assert not c["ok"] and "miner1 logprob" in c["detail"]
