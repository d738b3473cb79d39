"""CPU thread settings for the small models p2prl runs on CPU.

The default model's matrices are tiny (64×256): one op takes microseconds, so torch's intra-op
threads spend more time synchronising than computing, and on a shared machine an OpenMP barrier
waits a whole scheduler slice for a preempted sibling thread. Measured on the 2-core development
box under load: a train-local step took ~3.4 s with torch's default 2 threads and ~0.1–0.2 s with
one. Every p2prl process running a small model should therefore use one thread (several processes,
e.g. a trainer, a validator and miners, then share the cores without stepping on each other).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

THREADS_ENV = "P2PRL_TORCH_THREADS"
DEFAULT_THREADS = 1


def default_threads() -> int:
    """``$P2PRL_TORCH_THREADS`` when set to a positive integer, else 1."""
    try:
        n = int(os.environ.get(THREADS_ENV, ""))
    except ValueError:
        return DEFAULT_THREADS
    return n if n > 0 else DEFAULT_THREADS


@contextmanager
def torch_threads(n: int | None = None) -> Iterator[int]:
    """Run the block with ``n`` intra-op threads (default: ``default_threads()``), then restore."""
    want = default_threads() if n is None or n <= 0 else n
    prev = torch.get_num_threads()
    torch.set_num_threads(want)
    try:
        yield want
    finally:
        torch.set_num_threads(prev)
