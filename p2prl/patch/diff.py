"""Where two versions of a segment differ: the positions and both bit patterns there.

The publish diffs every element of the model each version, so this is its largest cost. At the
sparsity a training step leaves (about 1% of bf16 elements), most 64-bit words of a segment hold no
change: comparing words, then only the changed words' elements, reads the segment once and gathers
from a small array, about a third less work than numpy's element compare, ``flatnonzero`` and two
gathers over the whole segment. Where many words changed, the element path is the faster one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Changed", "changes"]

WORD = np.dtype(np.uint64)
# above this share of changed words, comparing words first costs more than it saves
MAX_WORD_SHARE = 0.3
SAMPLE_WORDS = 1 << 14


class Changed(NamedTuple):
    """The changed elements of a segment: positions ascending (int64), and both bit patterns there."""

    pos: np.ndarray
    new: np.ndarray
    old: np.ndarray


def changes(old: np.ndarray, new: np.ndarray, limit: int) -> tuple[int, Changed | None]:
    """How many elements of two 1-D unsigned arrays of one dtype and length differ, and which (None
    when more than ``limit`` differ: a dense segment needs no positions)."""
    per = WORD.itemsize // old.dtype.itemsize
    bulk = old.size - old.size % per if per > 1 else 0
    if bulk:
        wo, wn = old[:bulk].view(WORD), new[:bulk].view(WORD)
        head = min(wo.size, SAMPLE_WORDS)  # the share of changed words, judged on the first ones
        if np.count_nonzero(wo[:head] != wn[:head]) <= MAX_WORD_SHARE * head:
            wi = np.flatnonzero(wo != wn)
            o, n = wo[wi].view(old.dtype), wn[wi].view(old.dtype)
            inner = np.flatnonzero(o != n)
            pos = (wi[inner // per] * per) + (inner % per)
            nv, ov = n[inner], o[inner]
            if bulk < old.size:  # the elements past the last whole word
                tail = bulk + np.flatnonzero(old[bulk:] != new[bulk:])
                pos = np.concatenate([pos, tail])
                nv, ov = np.concatenate([nv, new[tail]]), np.concatenate([ov, old[tail]])
            return pos.size, (Changed(pos, nv, ov) if pos.size <= limit else None)
    differ = old != new
    count = int(np.count_nonzero(differ))
    if count > limit:
        return count, None
    pos = np.flatnonzero(differ)
    return count, Changed(pos, new[pos], old[pos])
