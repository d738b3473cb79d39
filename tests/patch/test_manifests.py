"""ManifestStore: only trainer-signed manifests are kept; conflicts refused; bounded; persisted and
re-verified; and the on-disk layout of earlier versions (``<version, 12 digits>-<kind>.env``) opens."""

import json
from pathlib import Path

import pytest
from patch_testutil import bits_equal, perturb, random_state

from p2prl.crypto.keys import Identity
from p2prl.patch.chain import ChainPublisher, plan_sync
from p2prl.patch.manifests import ManifestError, ManifestStore
from p2prl.protocol.blobs import MIN_CHUNK_SIZE, blob_ref_for
from p2prl.protocol.messages import PatchManifest, encode_message

TRAINER = Identity(b"\x05" * 32)


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


def test_store(tmp_path: Path) -> None:
    other = Identity.generate()
    book = ManifestStore("net", TRAINER.public_key, tmp_path)
    assert book.add(manifest(TRAINER, 1, "11" * 32)) is not None
    assert book.add(manifest(TRAINER, 1, "11" * 32)) is None  # duplicate
    with pytest.raises(ManifestError, match="manifest rejected"):
        book.add(manifest(other, 2, "22" * 32))  # not the trainer
    bad = bytearray(manifest(TRAINER, 2, "22" * 32))
    bad[-1] ^= 1
    with pytest.raises(ManifestError, match="manifest rejected"):
        book.add(bytes(bad))
    with pytest.raises(ManifestError, match="conflicting"):
        book.add(manifest(TRAINER, 1, "33" * 32))  # a fork of version 1
    with pytest.raises(ManifestError, match="conflicting"):
        book.add(manifest(TRAINER, 1, "11" * 32, data=b"y"))  # same result, another blob
    assert book.add(manifest(TRAINER, 3, "44" * 32, "anchor", b"a")) is not None
    assert book.add(manifest(TRAINER, 3, "44" * 32, "delta", b"d")) is not None  # both kinds at v3
    with pytest.raises(ManifestError, match="conflicting"):
        book.add(manifest(TRAINER, 3, "55" * 32, "anchor", b"b"))
    assert book.versions() == [1, 3] and book.newest().version == 3
    assert book.conflicts == 3
    # reload from disk: re-verified; a corrupted file is dropped
    (tmp_path / "000000000009-delta.env").write_bytes(b"garbage")
    again = ManifestStore("net", TRAINER.public_key, tmp_path)
    assert [m.version for m in again.all()] == [1, 3, 3]
    assert not (tmp_path / "000000000009-delta.env").exists()
    # pruning keeps the anchor the retained versions start from
    gone = again.prune_below(4)
    assert [m.kind for m in again.all()] == ["anchor"] and len(gone) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000003-anchor.env"]


def test_bounded_oldest_first(tmp_path: Path) -> None:
    book = ManifestStore("net", TRAINER.public_key, tmp_path, capacity=4)
    for v in range(1, 8):
        book.add(manifest(TRAINER, v, f"{v:02d}" * 32, data=bytes([v])))
    assert book.versions() == [4, 5, 6, 7] and len(list(tmp_path.iterdir())) == 4
    assert len(ManifestStore("net", TRAINER.public_key, tmp_path, capacity=2)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000006-delta.env", "000000000007-delta.env"]


def test_a_node_data_dir_of_an_earlier_version_opens(tmp_path: Path) -> None:
    """A miner's or validator's ``<role>/manifests`` as earlier versions wrote it: one envelope per
    file, named by version (12 digits) and kind."""
    d = tmp_path / "miner" / "manifests"
    d.mkdir(parents=True)
    for v, kind in ((0, "anchor"), (1, "delta"), (2, "delta")):
        envelope = manifest(TRAINER, v, f"{v:02d}" * 32, kind, bytes([v]))
        (d / f"{v:012d}-{kind}.env").write_bytes(envelope)
    book = ManifestStore("net", TRAINER.public_key, d)
    assert [(m.version, m.kind) for m in book.all()] == [(0, "anchor"), (1, "delta"), (2, "delta")]
    book.add(manifest(TRAINER, 3, "03" * 32, data=b"\x03"))
    assert (d / "000000000003-delta.env").exists()


def test_a_trainer_data_dir_of_an_earlier_version_resumes(tmp_path: Path) -> None:
    """The publisher's ``chain.json`` and ``manifests/`` as earlier versions wrote them, left by a
    crash after signing version 4 and before its commit point: it resumes at 3 and signs 4 again."""
    root = tmp_path / "trainer" / "chain"
    pub = ChainPublisher(root, TRAINER, "net", anchor_interval=2, chunk_size=MIN_CHUNK_SIZE)
    state = random_state({"w": (32, 24), "b": (24,)}, seed=1)
    for i in range(4):
        state = perturb(state, 0.05, seed=i) if i else state
        pub.publish(state)
    held = [(0, "anchor"), (1, "delta"), (2, "anchor"), (2, "delta"), (3, "delta")]
    assert sorted(p.name for p in (root / "manifests").iterdir()) == [f"{v:012d}-{k}.env" for v, k in held]
    assert json.loads((root / "chain.json").read_text())["version"] == 3
    # an uncommitted version 4, signed by the trainer, for weights never committed
    fields = {**pub.manifests.get(3).__dict__, "version": 4, "base_version": 3, "result_hash": "ee" * 32}
    stray = PatchManifest(**fields)
    (root / "manifests" / "000000000004-delta.env").write_bytes(encode_message(TRAINER, "net", stray))
    again = ChainPublisher(root, TRAINER, "net", anchor_interval=2, chunk_size=MIN_CHUNK_SIZE)
    assert again.version == 3 and bits_equal(again.state, state)
    assert not (root / "manifests" / "000000000004-delta.env").exists()
    pv = again.publish(perturb(state, 0.05, seed=9))
    assert pv.version == 4 and again.manifests.get(4).result_hash == pv.result_hash
    assert [m.version for m in plan_sync(2, pub.manifests.get(2).result_hash, again.manifests, 4)] == [3, 4]
