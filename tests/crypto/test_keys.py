import json
import os

import pytest

from p2prl.crypto.keys import (
    Identity,
    KeyFileError,
    load_identity,
    load_or_create_identity,
    save_identity,
    verify_signature,
)
from p2prl.net.identity import peer_id_for, public_key_of_peer_id


def test_seed_determines_key_and_peer_id():
    a, b = Identity(b"\x07" * 32), Identity(b"\x07" * 32)
    assert a.public_key == b.public_key
    assert peer_id_for(a) == peer_id_for(b)
    assert peer_id_for(a).startswith("12D3KooW")
    assert public_key_of_peer_id(peer_id_for(a)) == a.public_key
    assert peer_id_for(Identity(b"\x08" * 32)) != peer_id_for(a)


def test_bad_seed_length():
    with pytest.raises(ValueError):
        Identity(b"short")


def test_sign_verify():
    ident = Identity.generate()
    sig = ident.sign(b"msg")
    assert verify_signature(ident.public_key, b"msg", sig)
    assert not verify_signature(ident.public_key, b"msg2", sig)
    assert not verify_signature(Identity.generate().public_key, b"msg", sig)
    assert not verify_signature(ident.public_key, b"msg", sig[:-1])
    assert not verify_signature(b"\x00" * 31, b"msg", sig)


def test_key_file_roundtrip_and_permissions(tmp_path):
    ident = Identity.generate()
    p = save_identity(ident, tmp_path / "k" / "node.key")
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert load_identity(p) == ident
    with pytest.raises(KeyFileError, match="refusing"):
        save_identity(Identity.generate(), p)
    os.chmod(p, 0o644)
    with pytest.raises(KeyFileError, match="group/others"):
        load_identity(p)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"format": "other", "seed": "00" * 32}),
        json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": "zz"}),
        # the seed's one spelling is 64 lowercase hex (as the public key's): no other is taken
        json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": "AB" * 32}),
        json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": " " + "ab" * 32}),
        json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": "ab " * 32}),
        json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": 7}),
    ],
)
def test_malformed_key_files(tmp_path, content):
    p = tmp_path / "bad.key"
    p.write_text(content)
    os.chmod(p, 0o600)
    with pytest.raises(KeyFileError):
        load_identity(p)


def test_mismatched_public_key(tmp_path):
    p = tmp_path / "k.key"
    p.write_text(json.dumps({"format": "p2prl-ed25519-seed-v1", "seed": "11" * 32, "public_key": "00" * 32}))
    os.chmod(p, 0o600)
    with pytest.raises(KeyFileError, match="does not match"):
        load_identity(p)


def test_load_or_create(tmp_path):
    p = tmp_path / "node.key"
    a = load_or_create_identity(p)
    assert load_or_create_identity(p) == a
