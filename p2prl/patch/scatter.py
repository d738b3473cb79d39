"""Writing many changed elements at once: ``view[positions] = values`` over disjoint ranges, split
over a few threads when there are many (numpy lets the GIL go while it scatters: on two cores a
0.5B-shaped model's 4.7M changed elements took 23 ms on two threads against 37 ms on one)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SCATTER_THREADS = max(1, min(4, os.cpu_count() or 1))
SPLIT_ELEMENTS = 1 << 20  # below this many elements in all, one thread writes them
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

Scatter = tuple[np.ndarray, np.ndarray, np.ndarray]  # view, positions in it, values


def scatter_all(jobs: list[Scatter]) -> None:
    """``view[pos] = values`` for each job; the jobs must write disjoint memory."""
    global _pool
    total = sum(int(pos.size) for _, pos, _ in jobs)
    if SCATTER_THREADS < 2 or total < SPLIT_ELEMENTS or len(jobs) < 2:
        _run(jobs)
        return
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(SCATTER_THREADS, thread_name_prefix="p2prl-scatter")
        pool = _pool
    share = -(-total // SCATTER_THREADS)
    parts: list[list[Scatter]] = [[]]
    size = 0
    for job in jobs:  # contiguous runs of about equal size, one per thread
        if size >= share:
            parts.append([])
            size = 0
        parts[-1].append(job)
        size += int(job[1].size)
    for f in [pool.submit(_run, part) for part in parts]:
        f.result()


def _run(jobs: list[Scatter]) -> None:
    for view, pos, values in jobs:
        view[pos] = values
