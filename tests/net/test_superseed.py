"""Superseeding: a publisher serves each chunk of a complete blob once per cooldown, not once per peer."""

import time
from pathlib import Path
from types import SimpleNamespace

from p2prl.net import chunkproto as cp
from p2prl.net.config import NetConfig
from p2prl.net.counters import Counters
from p2prl.net.partial import PartialStore
from p2prl.net.swarm import ChunkServer
from p2prl.protocol.blobs import blob_ref_for
from p2prl.store import BlobStore

CH = 64 * 1024


def server(tmp_path: Path, cooldown: float) -> tuple[ChunkServer, tuple[str, str]]:
    """A superseeding server holding one blob; returns it and the (blob id, ref digest) to ask for."""
    store = BlobStore(tmp_path / "s")
    data = bytes(range(256)) * (3 * CH // 256)
    ref = blob_ref_for(data, CH)
    store.put(data)
    ctx = SimpleNamespace(
        config=NetConfig(superseed=True, superseed_cooldown_s=cooldown), counters=Counters()
    )
    srv = ChunkServer(ctx, store, PartialStore(store, 1 << 30))  # type: ignore[arg-type]
    srv.refs.add(ref)
    return srv, (ref.id, ref.digest)


def test_second_copy_of_a_chunk_waits_a_cooldown(tmp_path: Path) -> None:
    srv, key = server(tmp_path, cooldown=60.0)
    assert srv.answer(cp.OP_GET, *key, 0, CH)[0] == cp.OK
    assert srv.answer(cp.OP_GET, *key, 0, CH)[0] == cp.BUSY  # a peer that has it serves the rest
    assert srv.answer(cp.OP_GET, *key, 1, CH)[0] == cp.OK  # other chunks are unaffected
    assert srv.answer(cp.OP_HAVE, *key, 0, CH)[0] == cp.OK


def test_copies_allowed_again_after_each_cooldown(tmp_path: Path) -> None:
    srv, key = server(tmp_path, cooldown=0.05)
    assert srv.answer(cp.OP_GET, *key, 2, CH)[0] == cp.OK
    time.sleep(0.12)  # more than one cooldown: a second copy (a peer died with the first)
    assert srv.answer(cp.OP_GET, *key, 2, CH)[0] == cp.OK
