import hashlib

import pytest

from p2prl.store import BlobStore, StoreError


def test_put_get_and_reopen(tmp_path):
    s = BlobStore(tmp_path, max_bytes=1000)
    bid = s.put(b"hello")
    assert bid == hashlib.sha256(b"hello").hexdigest()
    assert s.get(bid) == b"hello" and s.read_range(bid, 1, 3) == b"ell"
    assert BlobStore(tmp_path).has(bid)
    with pytest.raises(StoreError):
        s.read_range(bid, 3, 10)


def test_wrong_hash_is_refused(tmp_path):
    s = BlobStore(tmp_path)
    with pytest.raises(StoreError):
        s.put(b"data", expected_id="00" * 32)
    assert s.ids() == []
    f = tmp_path / "incoming"
    f.write_bytes(b"abc")
    with pytest.raises(StoreError):
        s.put_file(f, expected_id="00" * 32)
    assert not f.exists() and s.ids() == []


def test_lru_eviction_spares_pinned(tmp_path):
    s = BlobStore(tmp_path, max_bytes=30)
    a, b = s.put(b"a" * 10), s.put(b"b" * 10)
    s.pin([a])
    c = s.put(b"c" * 15)  # evicts b, the unpinned least recently used
    assert s.has(a) and not s.has(b) and s.has(c) and s.used_bytes <= 30
    with pytest.raises(StoreError):
        s.put(b"d" * 31)
    s.pin([c])
    with pytest.raises(StoreError, match="pinned"):
        s.put(b"e" * 10)


def test_bad_ids(tmp_path):
    s = BlobStore(tmp_path)
    for bad in ["../etc/passwd", "AB" * 32, "a" * 63, "a" * 64 + "\n", "g" * 64]:
        with pytest.raises(StoreError):
            s.path(bad)
        assert not s.has(bad)
