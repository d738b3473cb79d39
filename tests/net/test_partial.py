import os

import pytest

from p2prl.net.partial import PartialStore
from p2prl.protocol.blobs import blob_ref_for
from p2prl.store import BlobStore

CH = 16 * 1024


def test_chunks_verified_resumed_and_finished(tmp_path) -> None:
    data = os.urandom(5 * CH + 100)
    ref = blob_ref_for(data, CH)
    store = BlobStore(tmp_path / "s")
    ps = PartialStore(store, 1 << 30)
    p = ps.open(ref)
    assert not p.write(0, b"\x00" * CH)  # wrong bytes are refused, nothing written
    assert p.write(0, data[:CH]) and p.write(5, data[5 * CH :])
    assert p.read(0) == data[:CH] and p.read(1) is None
    ps.release(ref)
    # a fresh store object (a restart) finds the verified chunks again by re-hashing
    ps2 = PartialStore(BlobStore(tmp_path / "s"), 1 << 30)
    p2 = ps2.open(ref)
    assert p2.have == [True, False, False, False, False, True]
    for i in range(1, 5):
        assert p2.write(i, data[i * CH : (i + 1) * CH])
    assert p2.complete
    assert ps2.finish(ref) == ref.id
    assert ps2.store.get(ref.id) == data
    assert not list((tmp_path / "s" / "partial").glob("*.part"))


def test_partial_bytes_are_bounded(tmp_path) -> None:
    store = BlobStore(tmp_path / "s")
    ps = PartialStore(store, 3 * CH)
    refs = [blob_ref_for(os.urandom(2 * CH), CH) for _ in range(2)]
    ps.open(refs[0])
    ps.release(refs[0])
    ps.open(refs[1])  # the older, inactive partial is dropped to make room
    assert [q.stem for q in (tmp_path / "s" / "partial").glob("*.part")] == [refs[1].digest]
    with pytest.raises(ValueError):
        ps.open(blob_ref_for(os.urandom(4 * CH), CH))


def test_concurrent_fetches_never_trip_over_each_others_partials(tmp_path) -> None:
    """Many rollout-sized downloads at once (keep_partial False, as a validator fetches): each
    opens its partial while others finish theirs (moved into the store) or drop them. Opening
    scans the partial directory; a file gone between listing and stat failed an unrelated
    download with ENOENT (an honest batch rejected)."""
    from concurrent.futures import ThreadPoolExecutor

    from p2prl.bench.peerproc import blob_bytes
    from p2prl.crypto.keys import Identity
    from p2prl.net.config import NetConfig
    from p2prl.net.node import P2PNode

    provider = P2PNode(Identity.generate(), "testnet", BlobStore(tmp_path / "p"), NetConfig())
    fetcher = P2PNode(Identity.generate(), "testnet", BlobStore(tmp_path / "f"), NetConfig())
    # leftovers of earlier downloads (resumable patches): the directory scan takes a while
    for i in range(3000):
        (fetcher.partials.dir / f"{i:064x}.part").write_bytes(b"")
    refs = []
    for seed in range(64):
        data = blob_bytes(seed, 4000 + seed)
        provider.store.put(data)
        refs.append(blob_ref_for(data, 256 * 1024))
    provider.start()
    fetcher.start()
    try:
        fetcher.connect(provider.addrs[0])
        for ref in refs:
            fetcher.add_provider_hint(ref.id, provider.peer_id)

        def fetch(ref):
            try:
                fetcher.fetch(ref, timeout=60, s3=False, keep_partial=False)
            except Exception as e:
                return repr(e)
            return None

        with ThreadPoolExecutor(16) as pool:
            errors = [e for e in pool.map(fetch, refs) if e is not None]
        assert not errors, errors
        assert all(fetcher.store.has(ref.id) for ref in refs)
        assert not [q for q in fetcher.partials.dir.glob("*.part") if q.stat().st_size]
    finally:
        fetcher.stop()
        provider.stop()


@pytest.mark.slow
def test_probe_that_runs_out_of_time_then_full_fetch(tmp_path) -> None:
    """A validator's probe (short timeout, keep_partial False) runs out of time against a slow
    provider with some chunks written; its download tasks have ended before its partial goes, so
    the full fetch that follows starts on a clean file and completes (no ENOENT)."""
    import pytest

    from p2prl.bench.peerproc import _server_class, blob_bytes
    from p2prl.crypto.keys import Identity
    from p2prl.net.config import NetConfig
    from p2prl.net.node import FetchError, P2PNode

    slow = _server_class("slow", 0.3)
    provider = P2PNode(
        Identity.generate(), "testnet", BlobStore(tmp_path / "p"), NetConfig(), server_class=slow
    )
    fetcher = P2PNode(Identity.generate(), "testnet", BlobStore(tmp_path / "f"), NetConfig())
    data = blob_bytes(7, 8 * CH)
    provider.store.put(data)
    ref = blob_ref_for(data, CH)
    provider.start()
    fetcher.start()
    try:
        fetcher.connect(provider.addrs[0])
        fetcher.add_provider_hint(ref.id, provider.peer_id)
        arrived = []
        with pytest.raises(FetchError, match="missing"):
            fetcher.fetch(
                ref, timeout=1.0, s3=False, keep_partial=False, on_progress=lambda d, _t: arrived.append(d)
            )
        assert any(arrived)  # the probe had written chunks when it ran out of time
        assert not list(fetcher.partials.dir.glob("*.part"))
        path = fetcher.fetch(ref, timeout=30, s3=False, keep_partial=False)
        assert path.read_bytes() == data
    finally:
        fetcher.stop()
        provider.stop()
