"""``addition``: ``"12+34="`` → ``"46"``, the default task (the built-in model is warm-started on it).

Two styles. ``exact`` (the default, the built-in model's): the prompt is ``"12+34="`` and only the sum
itself earns 1.0. ``chat`` (a pretrained instruct model's): the prompt is a question, the answer is
the integer the model states (after its ``=``, else its first), and a wrong answer still earns
shaped credit, so the groups GRPO learns from are not all equal while the model rarely gets the sum
right (see docs/RL.md).
"""

from __future__ import annotations

import re

from p2prl.rl.tasks.base import Problem, Task, seed_ints

STYLES = ("exact", "chat")
CHAT_PROMPT = "What is {a} + {b}? Answer with the number only."
# what the reward reads of a completion: a miner's text is bounded before any regex runs on it
MAX_READ = 256
_INT = re.compile(r"-?\d{1,19}")
# shaped credit (thousandths, so the reward is the same float on every machine)
CREDIT_NUMBER = 100  # the completion states a number at all
CREDIT_TERSE = 200  # ... and nothing else (the format asked for: "the number only")
CREDIT_CLOSE = 300  # ... scaled by how close it is: 1 - |n - sum| / max(sum, 10), floored at 0


def _operand(length_draw: int, value_draw: int, digits: int) -> int:
    n = 1 + length_draw % digits
    lo = 0 if n == 1 else 10 ** (n - 1)
    return lo + value_draw % (10**n - lo)


def stated_answer(text: str) -> tuple[int | None, bool]:
    """The integer a chat model states as its answer, read from the first :data:`MAX_READ` characters:
    the first integer after the first ``=`` when there is one (``"23 + 48 = 71"``), else the first
    integer; and whether the text is that number alone (whitespace and one trailing period allowed)."""
    head = text[:MAX_READ]
    eq = head.find("=")
    m = _INT.search(head, eq + 1) if eq >= 0 else _INT.search(head)
    if m is None:
        return None, False
    terse = head.strip().removesuffix(".") == m.group(0) and len(text) <= MAX_READ
    return int(m.group(0)), terse


class AdditionTask(Task):
    """Each operand has a length drawn uniformly from ``1..digits``, then its digits uniformly (a
    leading digit nonzero unless it is a one-digit number), so the task mixes easy one-digit facts
    with carries over several digits. ``style="exact"``: the completion must be the sum exactly.
    ``style="chat"``: the stated integer is the answer (1.0 when it is the sum); otherwise credit for
    stating a number, for stating only a number, and for closeness, at most 0.6 in all."""

    name = "addition"

    def __init__(self, digits: int = 2, style: str = "exact") -> None:
        if not isinstance(digits, int) or not 1 <= digits <= 18:
            raise ValueError("digits must be an integer in 1..18")
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}")
        self.digits = digits
        self.style = style

    def problem(self, seed: bytes) -> Problem:
        la, lb, x, y = seed_ints(seed, 4)
        a, b = _operand(la, x, self.digits), _operand(lb, y, self.digits)
        prompt = f"{a}+{b}=" if self.style == "exact" else CHAT_PROMPT.format(a=a, b=b)
        return Problem(prompt=prompt, answer=str(a + b), meta={"a": a, "b": b})

    def correct(self, problem: Problem, completion: str) -> bool:
        if self.style == "exact":
            return completion == problem.answer
        n, _ = stated_answer(completion)
        return n is not None and str(n) == problem.answer

    def reward(self, problem: Problem, completion: str) -> float:
        if self.correct(problem, completion):
            return 1.0
        if self.style == "exact":
            return 0.0
        n, terse = stated_answer(completion)
        if n is None:
            return 0.0
        want = int(problem.answer)
        scale = max(want, 10)
        close = max(0, scale - abs(n - want)) * CREDIT_CLOSE // scale
        return (CREDIT_NUMBER + (CREDIT_TERSE if terse else 0) + close) / 1000
