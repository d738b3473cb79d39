"""Tasks with verifiable rewards: the problem comes from a public seed, the reward from the text alone.

A validator re-derives every prompt from ``derive_seed`` and recomputes every reward from the
completion, so a miner can neither pick easy problems nor claim rewards it did not earn.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; ``meta`` holds task-specific details (operands, index)."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


def derive_seed(manifest_hash: str, miner_key: bytes, index: int) -> bytes:
    """Seed of a miner's ``index``-th problem for a version.

    ``sha256(bytes.fromhex(manifest_hash) ‖ miner_key ‖ index as unsigned 64-bit big-endian)``: the
    manifest hash (hex) pins the version, the miner's public key keeps miners from copying each other,
    the index enumerates its problems. Anyone holding the three recomputes the same 32-byte seed.
    """
    if not 0 <= index < 2**64:
        raise ValueError("index must fit in an unsigned 64-bit integer")
    try:
        h = bytes.fromhex(manifest_hash)
    except ValueError as e:
        raise ValueError("manifest_hash must be hex") from e
    return hashlib.sha256(h + bytes(miner_key) + index.to_bytes(8, "big")).digest()


def _seed_ints(seed: bytes, n: int) -> list[int]:
    """``n`` independent 64-bit integers from a seed (sha256 in counter mode: stable across Pythons)."""
    out = []
    for i in range(n):
        d = hashlib.sha256(b"p2prl-task" + bytes(seed) + i.to_bytes(4, "big")).digest()
        out.append(int.from_bytes(d[:8], "big"))
    return out


class Task:
    """A family of problems with an exact reward: 1.0 right, 0.0 wrong or malformed."""

    name: str = ""

    def problem(self, seed: bytes) -> Problem:
        raise NotImplementedError

    def reward(self, problem: Problem, completion: str) -> float:
        raise NotImplementedError


def _operand(length_draw: int, value_draw: int, digits: int) -> int:
    n = 1 + length_draw % digits
    lo = 0 if n == 1 else 10 ** (n - 1)
    return lo + value_draw % (10**n - lo)


class AdditionTask(Task):
    """``"12+34="`` → ``"46"``: each operand has a length drawn uniformly from ``1..digits``, then its
    digits uniformly (a leading digit nonzero unless it is a one-digit number), so the task mixes easy
    one-digit facts with carries over several digits; the completion must be the sum exactly."""

    name = "addition"

    def __init__(self, digits: int = 2) -> None:
        if not 1 <= digits <= 18:
            raise ValueError("digits must be in 1..18")
        self.digits = digits

    def problem(self, seed: bytes) -> Problem:
        la, lb, x, y = _seed_ints(seed, 4)
        a, b = _operand(la, x, self.digits), _operand(lb, y, self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion == problem.answer else 0.0


_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def _normalize_number(text: str) -> Decimal | None:
    """``"$1,234.50"`` → ``Decimal("1234.5")``; ``None`` when it is not a number."""
    t = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        v = Decimal(t)
    except InvalidOperation:
        return None
    return v if v.is_finite() else None


def parse_final_answer(text: str) -> Decimal | None:
    """The number after the last ``####``, else the last number in the text; ``None`` if there is none."""
    if "####" in text:
        m = _NUMBER.search(text.rsplit("####", 1)[1])
        return _normalize_number(m.group(0)) if m else None
    found = _NUMBER.findall(text)
    return _normalize_number(found[-1]) if found else None


class GSM8KTask(Task):
    """GSM8K-style exact-answer math from a local JSONL file of ``{"question", "answer"}`` records.

    The reference answer is the number after ``####`` in the record's answer; a completion earns 1.0
    when its final answer (see ``parse_final_answer``) equals it numerically. Nothing is downloaded.
    """

    name = "gsm8k"
    PROMPT = "Question: {question}\nAnswer:"

    def __init__(self, path: str | Path | None = None, max_records: int = 1_000_000) -> None:
        if path is None:
            text = resources.files("p2prl.rl").joinpath("data/gsm8k_sample.jsonl").read_text()
        else:
            text = Path(path).read_text()
        self.records: list[tuple[str, str]] = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            if len(self.records) >= max_records:
                break
            rec = json.loads(line)
            ans = parse_final_answer(str(rec["answer"]))
            if ans is None:
                raise ValueError(f"record {i}: answer has no final number")
            self.records.append((str(rec["question"]), format(ans.normalize(), "f")))
        if not self.records:
            raise ValueError("no records")

    def problem(self, seed: bytes) -> Problem:
        idx = _seed_ints(seed, 1)[0] % len(self.records)
        q, a = self.records[idx]
        return Problem(prompt=self.PROMPT.format(question=q), answer=a, meta={"index": idx})

    def reward(self, problem: Problem, completion: str) -> float:
        got = parse_final_answer(completion)
        want = _normalize_number(problem.answer)
        return 1.0 if got is not None and want is not None and got == want else 0.0


_TASKS: dict[str, type[Task]] = {"addition": AdditionTask, "gsm8k": GSM8KTask}
DEFAULT_TASK = "addition"


def get_task(name: str, **params: Any) -> Task:
    """The task registered under ``name``, built with ``params`` (e.g. ``digits=3``, ``path=...``)."""
    try:
        cls = _TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)}") from None
    return cls(**params)
