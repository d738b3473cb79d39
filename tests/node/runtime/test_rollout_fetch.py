"""Item 8 of docs/SECURITY.md: rollout refs of any size. A validator's real context refuses a ref
beyond the genesis batch bound before allocating anything, deletes the partial file of a failed
rollout download, and rescans a large partial file off the network thread."""

from __future__ import annotations

import os
import threading
import time

import pytest

from p2prl.net.node import FetchError
from p2prl.node.runtime.role import rollout_blob_bound
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.setup.settings import ValidatorSettings
from p2prl.protocol.blobs import BlobRef

MIB = 1024 * 1024


def junk_ref(size: int, chunk: int) -> BlobRef:
    n = max(1, -(-size // chunk))
    return BlobRef(os.urandom(32).hex(), size, chunk, tuple(os.urandom(32).hex() for _ in range(n)))


@pytest.fixture
def validator(make_net):
    rt = build_runtime(make_net().config("validator"))
    yield rt.env(ValidatorSettings)
    rt.net.stop()


def partial_files(ctx) -> list[str]:
    return [p.name for p in ctx.net.partials.dir.glob("*.part")]


def test_oversized_rollout_ref_refused_before_fetching(validator) -> None:
    ref = junk_ref(2 * 1024 * MIB, 16 * MIB)  # signed by a miner key, announced with a real batch's shape
    assert ref.size > rollout_blob_bound(validator.g.generation)
    t0 = time.monotonic()
    with pytest.raises(FetchError):
        validator.fetch_rollouts(ref, validator.net.peer_id, timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert partial_files(validator) == []


def test_failed_rollout_download_leaves_no_partial(validator) -> None:
    ref = junk_ref(256 * 1024, 64 * 1024)  # within the bound, and nobody serves it
    with pytest.raises(FetchError):
        validator.fetch_rollouts(ref, validator.net.peer_id, timeout=1)
    assert partial_files(validator) == []


@pytest.mark.slow
def test_partial_rescan_does_not_freeze_the_network_thread(validator) -> None:
    net = validator.net
    ref = junk_ref(256 * MIB, 16 * MIB)
    for name in (ref.digest, ref.id):  # an interrupted download's file, full size: fetch rescans it
        with open(net.partials.dir / f"{name}.part", "wb") as f:
            f.truncate(ref.size)

    def fetch() -> None:
        with pytest.raises(FetchError):  # nobody serves it: it ends after the timeout
            net.fetch(ref, timeout=4, s3=False)

    t = threading.Thread(target=fetch)
    t.start()
    worst = 0.0
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        net.peers()  # a call answered on the network thread
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.02)
    t.join()
    assert worst < 0.5, f"network thread blocked for {worst:.2f} s"
