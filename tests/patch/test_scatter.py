"""Many scatters at once, split over threads when large: the same bits as one thread writes."""

from __future__ import annotations

import numpy as np
import pytest

import p2prl.patch.scatter as scatter_mod


@pytest.mark.parametrize(("threads", "split"), [(1, 1 << 20), (3, 1), (4, 10_000)])
def test_split_scatters_write_what_one_thread_writes(monkeypatch, threads, split) -> None:
    monkeypatch.setattr(scatter_mod, "SCATTER_THREADS", threads)
    monkeypatch.setattr(scatter_mod, "SPLIT_ELEMENTS", split)
    rng = np.random.default_rng(0)
    a = np.zeros(100_000, np.uint16)
    want = a.copy()
    jobs = []
    for start in range(0, a.size, 7_000):  # disjoint runs of one array, as a model's segments are
        view = a[start : start + 7_000]
        pos = np.sort(rng.choice(view.size, 300, replace=False))
        vals = rng.integers(1, 60_000, pos.size, dtype=np.uint16)
        want[start:][pos] = vals
        jobs.append((view, pos, vals))
    scatter_mod.scatter_all(jobs)
    assert np.array_equal(a, want)
