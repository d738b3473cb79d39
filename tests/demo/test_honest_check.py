"""The demo's honest check fails on what a rollout holds, never on when it arrived.

On a loaded machine the validator's 3 s probe misses honest batches (``unreachable``) and the next
batch of that version follows an unjudged one (``index_gap``): in three runs of
tests/demo/test_demo_honest.py at load 16, 96 groups each time. Those are counted, not failed on;
a ``sampling`` or ``fingerprint`` rejection of an honest miner still fails the check."""

from p2prl.demo.launcher import TIMING_REJECTIONS, honest_check, settled
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


def _network(**over: object) -> dict[str, dict[str, object]]:
    st: dict[str, dict[str, object]] = {
        "trainer": {"version": 7, "paused": True},
        "validator": {"version": 7, "gauges": {"judge_backlog": 0, "judge_in_hand": 0}},
        "miner1": {"version": 7, "counters": {"batches_announced": 9, "groups_accepted": 120}},
    }
    for k, v in over.items():
        st[k] = {**st[k], **v}  # type: ignore[dict-item]
    return st


def test_the_summary_waits_for_the_validator_to_judge_the_last_version() -> None:
    miners = ["miner1"]
    assert settled(_network(), miners) == (7, (9, 120, 0))
    assert settled(_network(trainer={"paused": False}), miners) is None
    assert settled(_network(validator={"version": 6}), miners) is None
    assert settled(_network(miner1={"version": 6}), miners) is None
    # a batch queued or being judged: its miner's score may still change
    assert settled(_network(validator={"gauges": {"judge_backlog": 1}}), miners) is None
    assert settled(_network(validator={"gauges": {"judge_in_hand": 1}}), miners) is None
