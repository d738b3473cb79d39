"""``countdown``: reach a target from given numbers with ``+ - * /``, checked exactly.

The completion's expression is parsed with ``ast`` into a whitelist of nodes (integer literals and the
four binary operators) and evaluated with exact fractions; nothing from it is ever executed. Every
problem has a solution: the target is computed from a random expression over the drawn numbers.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from p2prl.rl.tasks.base import Problem, Task, seed_ints

MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]+")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def extract_expression(completion: str) -> str:
    """What is graded: the text after the last ``####`` if any, else the last non-empty line; then
    anything from the first ``=`` on (a restated ``= target``) is dropped."""
    text = completion.rsplit("####", 1)[1] if "####" in completion else completion
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].split("=", 1)[0].strip() if lines else ""


def _literals(node: ast.AST) -> list[int] | None:
    """The integer literals of a whitelisted expression tree, or ``None`` if any node is not allowed."""
    if isinstance(node, ast.Expression):
        return _literals(node.body)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _literals(node.left), _literals(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    return None


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        return a / b  # ZeroDivisionError is caught by the caller
    assert isinstance(node, ast.Constant)
    return Fraction(node.value)


def evaluate(expression: str, numbers: list[int], use_all: bool) -> Fraction | None:
    """The exact value of ``expression`` if it is a well-formed ``+ - * /`` expression over integer
    literals drawn from ``numbers`` (each at most as often as given; exactly, with ``use_all``);
    ``None`` for anything else (other characters, operators, names, calls, division by zero)."""
    if not expression or len(expression) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used = _literals(tree)
    if used is None:
        return None
    want, got = Counter(numbers), Counter(used)
    if got - want or (use_all and got != want):
        return None
    try:
        return _value(tree)
    except (ZeroDivisionError, RecursionError):
        return None


class CountdownTask(Task):
    """``count`` numbers in ``1..max_number``; reach ``target`` using ``+ - * /`` and parentheses, each
    number at most once (``use_all``: exactly once). Reward 1.0 iff the graded expression (see
    ``extract_expression``) evaluates exactly to the target under those rules."""

    name = "countdown"
    PROMPT = (
        "Numbers: {numbers}. Target: {target}. Combine the numbers with + - * / and parentheses, "
        "using each number {rule}, to make the target. Answer with the expression.\nAnswer:"
    )

    def __init__(self, count: int = 4, max_number: int = 25, max_target: int = 1000, use_all: bool = False):
        for label, v, lo, hi in (("count", count, 2, 6), ("max_number", max_number, 1, 1000)):
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"{label} must be an integer in {lo}..{hi}")
        if not isinstance(max_target, int) or isinstance(max_target, bool) or max_target < 1:
            raise ValueError("max_target must be a positive integer")
        if not isinstance(use_all, bool):
            raise ValueError("use_all must be true or false")
        self.count, self.max_number, self.max_target, self.use_all = count, max_number, max_target, use_all

    def problem(self, seed: bytes) -> Problem:
        draws = seed_ints(seed, 3 * self.count + 1)
        numbers = [1 + d % self.max_number for d in draws[: self.count]]
        order = sorted(range(self.count), key=lambda i: draws[self.count + i])
        k = self.count if self.use_all else 2 + draws[-1] % (self.count - 1)
        value, expr = Fraction(numbers[order[0]]), str(numbers[order[0]])
        for step, i in enumerate(order[1:k]):
            n, op = numbers[i], draws[2 * self.count + step] % 4
            if op == 3 and value % n == 0:
                value, expr = value / n, f"({expr})/{n}"
            elif op == 2 and value * n <= self.max_target:
                value, expr = value * n, f"({expr})*{n}"
            elif op == 1 and value - n >= 1:
                value, expr = value - n, f"{expr}-{n}"
            else:
                value, expr = value + n, f"{expr}+{n}"
        target = int(value)
        prompt = self.PROMPT.format(
            numbers=" ".join(map(str, numbers)),
            target=target,
            rule="exactly once" if self.use_all else "at most once",
        )
        return Problem(prompt=prompt, answer=expr, meta={"numbers": numbers, "target": target})

    def reward(self, problem: Problem, completion: str) -> float:
        got = evaluate(extract_expression(completion), list(problem.meta["numbers"]), self.use_all)
        return 1.0 if got is not None and got == problem.meta["target"] else 0.0
