"""``digit-start``: an addition prompt, rewarded when the completion starts with a digit.

A format check, not arithmetic: a random-init model earns it on a fair share of its samples, so its
groups have reward variance and GRPO takes real steps. Benchmarks of the network's own costs on a
model nobody trained (``p2prl bench scale``) use it; it teaches nothing worth having.
"""

from __future__ import annotations

from p2prl.rl.tasks.addition import AdditionTask
from p2prl.rl.tasks.base import Problem


class DigitStartTask(AdditionTask):
    name = "digit-start"

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion[:1].isdigit() and completion[:1].isascii() else 0.0
