"""ManifestBook: only trainer-signed manifests are kept; conflicts refused; persisted and re-verified."""

from pathlib import Path

import pytest

from p2prl.crypto.keys import Identity
from p2prl.patch.manifests import ManifestBook
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.messages import PatchManifest, encode_message


def manifest(signer: Identity, version: int, result: str, kind: str = "delta", data: bytes = b"x") -> bytes:
    m = PatchManifest(
        version=version,
        base_version=version if kind == "anchor" else version - 1,
        base_hash="" if kind == "anchor" else "aa" * 32,
        result_hash=result,
        kind=kind,
        codec="c",
        blob=blob_ref_for(data, 16 * 1024),
        anchor_version=version if kind == "anchor" else 0,
    )
    return encode_message(signer, "net", m)


def test_book(tmp_path: Path) -> None:
    trainer, other = Identity.generate(), Identity.generate()
    book = ManifestBook("net", trainer.public_key, tmp_path)
    assert book.add(manifest(trainer, 1, "11" * 32)) is not None
    assert book.add(manifest(trainer, 1, "11" * 32)) is None  # duplicate
    with pytest.raises(ValueError, match="manifest rejected"):
        book.add(manifest(other, 2, "22" * 32))  # not the trainer
    bad = bytearray(manifest(trainer, 2, "22" * 32))
    bad[-1] ^= 1
    with pytest.raises(ValueError, match="manifest rejected"):
        book.add(bytes(bad))
    with pytest.raises(ValueError, match="conflicting"):
        book.add(manifest(trainer, 1, "33" * 32))  # a fork of version 1
    assert book.add(manifest(trainer, 3, "44" * 32, "anchor", b"a")) is not None
    assert book.add(manifest(trainer, 3, "44" * 32, "delta", b"d")) is not None  # both kinds at v3
    with pytest.raises(ValueError, match="conflicting"):
        book.add(manifest(trainer, 3, "55" * 32, "anchor", b"b"))
    assert book.versions() == [1, 3] and book.newest().version == 3
    assert book.conflicts == 2
    # reload from disk: re-verified; a corrupted file is dropped
    (tmp_path / "000000000009-delta.env").write_bytes(b"garbage")
    again = ManifestBook("net", trainer.public_key, tmp_path)
    assert [m.version for m in again.all()] == [1, 3, 3]
    assert not (tmp_path / "000000000009-delta.env").exists()
    # pruning keeps the anchor the retained versions start from
    gone = again.prune_below(4)
    assert [m.kind for m in again.all()] == ["anchor"] and len(gone) == 2
