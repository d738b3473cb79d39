"""The task interface: a problem from a public seed, a reward from the completion text alone.

A validator re-derives every prompt from ``derive_seed`` and recomputes every reward from the
completion, so a miner can neither pick easy problems nor claim rewards it did not earn. That only
holds if ``problem`` and ``reward`` are pure functions of their inputs and the task's parameters:
same seed, same problem, on every machine, Python and platform (see docs/TASKS.md).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


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


def seed_ints(seed: bytes, n: int) -> list[int]:
    """``n`` independent 64-bit integers from a seed (sha256 in counter mode: stable across Pythons).

    Tasks draw from these, never from ``random`` or numpy, whose streams may change between versions.
    """
    out = []
    for i in range(n):
        d = hashlib.sha256(b"p2prl-task" + bytes(seed) + i.to_bytes(4, "big")).digest()
        out.append(int.from_bytes(d[:8], "big"))
    return out


class Task(ABC):
    """A family of problems with a recomputable reward in [0, 1]: 1.0 right; 0.0 wrong or malformed, or
    a task's shaped partial credit (a float the same on every machine).

    Subclasses take their parameters as keyword arguments of ``__init__`` (JSON scalars: they are
    signed into the genesis) and raise ``ValueError`` on a bad one. ``problem`` must depend on the
    seed and the parameters only; ``reward`` on the problem and the completion only. ``reward`` sees
    text a miner chose: it must never raise, execute or import anything from it, and must stay cheap
    on any input (a validator runs it on every sampled rollout).
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def problem(self, seed: bytes) -> Problem:
        """The problem for a 32-byte seed (see ``derive_seed``); draw from ``seed_ints(seed, n)``."""

    @abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """The reward of ``completion`` (decoded text, without the stop token) for ``problem``."""

    def correct(self, problem: Problem, completion: str) -> bool:
        """Whether ``completion`` answers ``problem`` right (what accuracy counts): full reward, unless a
        task with partial credit says otherwise."""
        return self.reward(problem, completion) >= 1.0
