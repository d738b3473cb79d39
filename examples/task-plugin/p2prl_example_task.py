"""A complete p2prl task plugin: ``"57-12="`` → ``"45"``.

Installed with ``pip install ./examples/task-plugin``, it is found by ``p2prl.rl.tasks.get_task
("subtraction", digits=2)`` through the ``p2prl.tasks`` entry point its pyproject.toml declares.
"""

from __future__ import annotations

from p2prl.rl.tasks import Problem, Task, seed_ints


class SubtractionTask(Task):
    """Two operands of up to ``digits`` digits, the larger first; the completion must be the difference."""

    name = "subtraction"

    def __init__(self, digits: int = 2) -> None:
        if not isinstance(digits, int) or isinstance(digits, bool) or not 1 <= digits <= 9:
            raise ValueError("digits must be an integer in 1..9")
        self.digits = digits

    def problem(self, seed: bytes) -> Problem:
        x, y = seed_ints(seed, 2)
        a, b = x % 10**self.digits, y % 10**self.digits
        a, b = max(a, b), min(a, b)
        return Problem(prompt=f"{a}-{b}=", answer=str(a - b), meta={"a": a, "b": b})

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion == problem.answer else 0.0
