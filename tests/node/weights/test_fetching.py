"""A weights blob on a slow link: a fetch call that times out while chunks still arrive is resumed,
not failed; one in which nothing arrives fails. Real libp2p hosts on 127.0.0.1, the provider's
upload capped."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.net.swarm import FetchError
from p2prl.node.weights.fetching import fetch_while_progressing
from p2prl.protocol import blob_ref_for
from p2prl.store import BlobStore

NET = "fetchnet"


@pytest.mark.slow
def test_a_slow_fetch_goes_on_while_bytes_arrive_and_fails_when_none_do(tmp_path: Path) -> None:
    data = os.urandom(1024 * 1024)
    ref = blob_ref_for(data, 64 * 1024)
    slow = dataclasses.replace(NetConfig(), max_upload_bytes_per_s=320 * 1024)  # ~3 s for the blob
    provider = P2PNode(Identity.generate(), NET, BlobStore(tmp_path / "p"), slow)
    joiner = P2PNode(Identity.generate(), NET, BlobStore(tmp_path / "j"), NetConfig())
    with provider, joiner:
        provider.store.put(data)
        joiner.connect(provider.addrs[0])
        with pytest.raises(
            (FetchError, TimeoutError)
        ):  # one call bounded by the timeout (the sync loop's old way)
            joiner.fetch(ref, timeout=1.0, s3=False)  # fails mid-way; its partial download is kept
        seen: list[int] = []
        fetch_while_progressing(joiner, ref, 1.0, "test blob", lambda d, _t: seen.append(d))
        assert joiner.store.get(ref.id) == data and max(seen) == len(data)
        missing = blob_ref_for(os.urandom(200 * 1024), 64 * 1024)  # nobody holds it: no byte arrives
        with pytest.raises((FetchError, TimeoutError)):
            fetch_while_progressing(joiner, missing, 1.0, "missing blob")
