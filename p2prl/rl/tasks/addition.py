"""``addition``: ``"12+34="`` → ``"46"``, the default task (the built-in model is warm-started on it)."""

from __future__ import annotations

from p2prl.rl.tasks.base import Problem, Task, seed_ints


def _operand(length_draw: int, value_draw: int, digits: int) -> int:
    n = 1 + length_draw % digits
    lo = 0 if n == 1 else 10 ** (n - 1)
    return lo + value_draw % (10**n - lo)


class AdditionTask(Task):
    """Each operand has a length drawn uniformly from ``1..digits``, then its digits uniformly (a
    leading digit nonzero unless it is a one-digit number), so the task mixes easy one-digit facts
    with carries over several digits; the completion must be the sum exactly."""

    name = "addition"

    def __init__(self, digits: int = 2) -> None:
        if not isinstance(digits, int) or not 1 <= digits <= 18:
            raise ValueError("digits must be an integer in 1..18")
        self.digits = digits

    def problem(self, seed: bytes) -> Problem:
        la, lb, x, y = seed_ints(seed, 4)
        a, b = _operand(la, x, self.digits), _operand(lb, y, self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion == problem.answer else 0.0
