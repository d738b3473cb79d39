from fractions import Fraction

import pytest

from p2prl.rl.tasks import CountdownTask, derive_seed, get_task
from p2prl.rl.tasks.countdown import MAX_EXPRESSION_CHARS, evaluate, extract_expression


def _seeds(n: int) -> list[bytes]:
    return [derive_seed("11" * 32, b"miner", i) for i in range(n)]


def test_problems_are_deterministic_and_solvable_by_their_answer() -> None:
    task = get_task("countdown", count=4, max_number=25)
    probs = [task.problem(s) for s in _seeds(300)]
    assert probs == [get_task("countdown", count=4, max_number=25).problem(s) for s in _seeds(300)]
    assert len({p.prompt for p in probs}) > 250
    for p in probs:
        nums, target = p.meta["numbers"], p.meta["target"]
        assert len(nums) == 4 and all(1 <= n <= 25 for n in nums) and target >= 1
        assert f"Target: {target}." in p.prompt and " ".join(map(str, nums)) in p.prompt
        assert task.reward(p, p.answer) == 1.0  # the generating expression is a solution
    strict = CountdownTask(count=3, use_all=True)
    for p in (strict.problem(s) for s in _seeds(100)):
        assert "exactly once" in p.prompt and strict.reward(p, p.answer) == 1.0


def test_reward_right_wrong_and_formats() -> None:
    task = CountdownTask()
    p = type(task.problem(b"s"))(prompt="", answer="", meta={"numbers": [3, 7, 25, 50], "target": 100})
    assert task.reward(p, "(3 + 7) * 50 / 25 * 5") == 0.0  # 5 is not given
    assert task.reward(p, "50 * (7 - 3) / 2") == 0.0  # 2 is not given
    assert task.reward(p, "25 * (7 - 3)") == 1.0  # a subset, each at most once
    assert task.reward(p, "50 + 50") == 0.0  # 100, but 50 is given once
    assert task.reward(p, "I think\n#### 25*(7-3) = 100") == 1.0
    assert task.reward(p, "work...\n50+50\n25*(7-3)") == 1.0  # the last line is graded
    assert task.reward(p, "25*(7-3)\nno") == 0.0
    assert task.reward(p, "50 + 25 + 7 + 3") == 0.0  # 85
    assert task.reward(p, "") == 0.0
    assert task.reward(p, "100") == 0.0  # 100 is not a given number
    strict = CountdownTask(use_all=True)
    assert strict.reward(p, "25*(7-3)") == 0.0  # must use all four
    p2 = type(p)(prompt="", answer="", meta={"numbers": [3, 7, 25, 50], "target": 3 * 7 + 25 + 50})
    assert strict.reward(p2, "3*7+25+50") == 1.0
    p3 = type(p)(prompt="", answer="", meta={"numbers": [2, 2, 3], "target": 12})
    assert task.reward(p3, "2*2*3") == 1.0  # a repeated number may be used as often as it is given
    assert task.reward(p3, "2*2*3*2/2") == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "().__class__.__bases__[0].__subclasses__()",
        "exec('1')",
        "25**2",
        "50//2",
        "-3+7",
        "2_5*4",
        "25.0*4",
        "0x19*4",
        "lambda: 1",
        "(" * 150 + "25" + ")" * 150,
        "1" * 5000,
        "25*(7-3",
        "7/(3-3)",
        "25 * 4 if 1 else 0",
        "[25][0]*4",
    ],
)
def test_malformed_or_hostile_expressions_earn_nothing(text: str) -> None:
    p = CountdownTask().problem(b"s")
    p = type(p)(prompt="", answer="", meta={"numbers": [3, 7, 25, 50, 4, 0, 1, 2], "target": 100})
    assert CountdownTask().reward(p, "25*4") == 1.0  # the control: these numbers can make 100
    assert CountdownTask().reward(p, text) == 0.0


def test_evaluate_is_exact_and_bounded() -> None:
    assert evaluate("7/3*3", [7, 3, 3], use_all=True) == Fraction(7)  # exact fractions, no float rounding
    assert evaluate("1+" * 200 + "1", [1] * 201, use_all=False) is None  # longer than the cap
    assert len("1+" * 200 + "1") > MAX_EXPRESSION_CHARS
    assert extract_expression("a\n#### (3+7)*10 = 100\n") == "(3+7)*10"
    assert extract_expression("\n\n") == ""


def test_bad_params_are_clear() -> None:
    for kw, why in [
        ({"count": 1}, "count must be an integer in 2..6"),
        ({"count": 7}, "count"),
        ({"max_number": 0}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"use_all": "yes"}, "use_all"),
        ({"count": True}, "count"),
    ]:
        with pytest.raises(ValueError, match=why):
            get_task("countdown", **kw)
