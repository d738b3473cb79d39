"""Short GIL slices while a thread of many short C calls runs beside a Python-bound one.

A weights check or a publish is thousands of numpy, zstd and BLAKE3 calls that each release the GIL
and then wait to take it back. Beside a thread that runs Python without pause (a transformers
generation loop, most of all one driving a GPU), CPython hands the GIL over only every switch
interval (5 ms): each of those calls then waits up to a slice, and a 0.4 s check of a 0.5B model
took 17 s beside a busy thread, a 0.5 s publish 13 s. While at least one such job runs the interval
is 0.2 ms (1 s and 1.1 s there); it is restored when the last one ends.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SLICE_S = 0.0002

_lock = threading.Lock()
_active = 0
_saved = 0.0


@contextmanager
def short_gil_slices(slice_s: float = SLICE_S) -> Iterator[None]:
    """Run the body with the interpreter's switch interval at most ``slice_s`` (nests and overlaps
    across threads: the interval the process had comes back when the last body ends)."""
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved, slice_s))
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                sys.setswitchinterval(_saved)
