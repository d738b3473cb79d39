"""``short_gil_slices``: the switch interval is short inside, and the process's comes back after the
last of several overlapping bodies ends."""

from __future__ import annotations

import sys
import threading

from p2prl.gilslices import SLICE_S, short_gil_slices


def test_short_inside_and_restored_after_the_last_of_overlapping_bodies() -> None:
    before = sys.getswitchinterval()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with short_gil_slices():
            entered.set()
            release.wait(10)

    th = threading.Thread(target=other)
    th.start()
    assert entered.wait(10)
    assert sys.getswitchinterval() <= SLICE_S
    with short_gil_slices():
        assert sys.getswitchinterval() <= SLICE_S
    assert sys.getswitchinterval() <= SLICE_S  # the other body still runs
    release.set()
    th.join(10)
    assert sys.getswitchinterval() == before
