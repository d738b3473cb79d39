"""A stopping miner does not wait out a fetch from a peer that is gone: its host stops under it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from p2prl.node.run import FINISH_STEP_S, start_node
from p2prl.protocol import blob_ref_for


@pytest.mark.slow
def test_stop_does_not_wait_for_a_fetch_nobody_answers(make_net) -> None:
    net = make_net(("trainer", "validator", "miner1"))
    m = start_node(net.config("miner1", fetch_timeout_s=120.0))
    ref = blob_ref_for(os.urandom(100_000), 64 * 1024)  # a blob whose holder is gone
    errors: list[BaseException] = []

    def fetch() -> None:  # as the sync thread fetching a patch from a trainer that exited
        try:
            m.rt.net.fetch(ref, timeout=120.0, s3=False)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=fetch, name="fetch")
    m.rt.threads.append(t)
    t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    m.close()
    took = time.monotonic() - t0
    assert not t.is_alive() and errors, "the fetch was not ended"
    assert took < FINISH_STEP_S + 10, took  # was the fetch's whole timeout
