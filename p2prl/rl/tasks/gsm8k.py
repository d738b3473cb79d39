"""``gsm8k``: grade-school math word problems from a local file, graded by the final number."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from p2prl.rl.tasks.base import Problem, seed_ints
from p2prl.rl.tasks.data import DataTask

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


class GSM8KTask(DataTask):
    """GSM8K-style exact-answer math from a JSONL or Parquet file of ``{"question", "answer"}`` records.

    The reference answer is the number after ``####`` in the record's answer; a completion earns 1.0
    when its final answer (see ``parse_final_answer``) equals it numerically. A problem is the record
    at ``seed_ints(seed, 1)[0] % len(records)``. Nothing is downloaded.
    """

    name = "gsm8k"
    SAMPLE = "p2prl.rl:data/gsm8k_sample.jsonl"
    PROMPT = "Question: {question}\nAnswer:"

    def __init__(
        self, path: str | Path | None = None, data_sha256: str | None = None, max_records: int = 1_000_000
    ) -> None:
        super().__init__(path, data_sha256, max_records)
        self.items: list[tuple[str, str]] = []
        for i, rec in enumerate(self.records):
            if not isinstance(rec.get("question"), str) or "answer" not in rec:
                raise ValueError(f"record {i}: needs a string 'question' and an 'answer'")
            ans = parse_final_answer(str(rec["answer"]))
            if ans is None:
                raise ValueError(f"record {i}: answer has no final number")
            self.items.append((rec["question"], format(ans.normalize(), "f")))

    def problem(self, seed: bytes) -> Problem:
        idx = seed_ints(seed, 1)[0] % len(self.items)
        q, a = self.items[idx]
        return Problem(prompt=self.PROMPT.format(question=q), answer=a, meta={"index": idx})

    def reward(self, problem: Problem, completion: str) -> float:
        got = parse_final_answer(completion)
        want = _normalize_number(problem.answer)
        return 1.0 if got is not None and want is not None and got == want else 0.0
