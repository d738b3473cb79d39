"""Genesis: signed by the trainer it names, verified on read, pinned per data directory."""

import json
from pathlib import Path

import pytest
from genesiskit import MODEL

from p2prl.crypto.envelope import seal
from p2prl.crypto.keys import Identity
from p2prl.node.setup.genesis import (
    GenesisError,
    SignedGenesis,
    make_genesis,
    pin_genesis,
    read_genesis,
    verify_genesis_bytes,
    write_genesis,
)
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.protocol.sections import GenerationSpec, PatchSpec, S3Spec, TaskSpec


def genesis(trainer: Identity, **kw: object) -> SignedGenesis:
    spec = NetworkSpec(network_id="net-a", validators=[Identity.generate().public_hex], **kw)  # type: ignore[arg-type]
    return genesis_from_spec(spec, trainer, MODEL)


def test_roundtrip_file(tmp_path: Path) -> None:
    t = Identity.generate()
    sg = genesis(t, s3_bucket="b", s3_endpoint="http://x", bootstrap=["/ip4/127.0.0.1/tcp/1"])
    p = write_genesis(sg, tmp_path / "g.json")
    assert p.stat().st_mode & 0o777 == 0o644  # the network's public document, unlike the keys
    back = read_genesis(p, expected_trainer=t.public_hex)
    assert back.genesis == sg.genesis
    assert back.trainer_key == t.public_key
    assert back.genesis.s3 == S3Spec(endpoint="http://x", bucket="b")
    assert back.genesis.generation.temperature_milli == 1000


def test_tampered_copy_and_envelope(tmp_path: Path) -> None:
    sg = genesis(Identity.generate())
    p = write_genesis(sg, tmp_path / "g.json")
    doc = json.loads(p.read_text())
    doc["genesis"]["max_staleness"] = 99
    p.write_text(json.dumps(doc))
    with pytest.raises(GenesisError, match="readable copy"):
        read_genesis(p)
    raw = bytearray(sg.envelope)
    raw[len(raw) // 2] ^= 1
    doc = {
        "format": "p2prl-genesis-v1",
        "network_id": "net-a",
        "envelope": raw.hex(),
        "genesis": sg.genesis.to_body(),
    }
    p.write_text(json.dumps(doc))
    with pytest.raises(GenesisError, match="rejected"):
        read_genesis(p)
    for bad in (
        "{",
        "[]",
        json.dumps({"format": "other"}),
        json.dumps({"format": "p2prl-genesis-v1", "network_id": 1}),
    ):
        p.write_text(bad)
        with pytest.raises(GenesisError):
            read_genesis(p)


def test_signed_by_someone_else() -> None:
    t, mallory = Identity.generate(), Identity.generate()
    body = genesis(t).genesis.to_body()
    forged = seal(mallory, "net-a", "genesis", body)  # names t as trainer, signed by mallory
    with pytest.raises(GenesisError, match="not signed by the trainer"):
        verify_genesis_bytes(forged, "net-a")
    # a genesis that mallory signs naming herself is valid, but not the one we expect
    own = genesis(mallory)
    with pytest.raises(GenesisError, match="expected"):
        verify_genesis_bytes(own.envelope, "net-a", expected_trainer=t.public_hex)
    with pytest.raises(GenesisError):
        verify_genesis_bytes(genesis(t).envelope, "net-b")


def test_trainer_cannot_be_validator() -> None:
    t = Identity.generate()
    with pytest.raises(GenesisError, match="validator"):
        make_genesis(
            t,
            network_id="n",
            model=MODEL,
            task=TaskSpec(),
            generation=GenerationSpec(),
            patch=PatchSpec(),
            validators=[t.public_hex],
            bootstrap=[],
            s3=None,
            max_staleness=1,
        )


def test_pinning(tmp_path: Path) -> None:
    t = Identity.generate()
    a = genesis(t)
    pin_genesis(a, tmp_path)
    pin_genesis(a, tmp_path)  # same genesis: fine
    with pytest.raises(GenesisError, match="another genesis"):
        pin_genesis(genesis(t, max_staleness=9), tmp_path)
    with pytest.raises(GenesisError, match="pinned to trainer"):
        pin_genesis(genesis(Identity.generate()), tmp_path)


def test_spec_checks() -> None:
    t = Identity.generate()
    with pytest.raises(ValueError, match="group_size"):
        genesis(t, group_size=1)
    with pytest.raises(ValueError, match="neither"):
        genesis_from_spec(NetworkSpec(validators=["nope"]), t, MODEL)


def test_every_refused_rule_prints_its_reason_code() -> None:
    """A genesis broken by a rule past its schema is refused with a reason code like any other."""
    t = Identity.generate()
    body = genesis(t).genesis.to_body()
    cases = {
        # signed for net-a, the body says net-b
        "bad_network": seal(t, "net-a", "genesis", {**body, "network_id": "net-b"}),
        # signed by another key than the trainer it names
        "unknown_signer": seal(Identity.generate(), "net-a", "genesis", body),
        # names a task data blob it does not list as an asset
        "bad_body": seal(t, "net-a", "genesis", {**body, "task": {**body["task"], "data_sha256": "aa" * 32}}),
    }
    for reason, raw in cases.items():
        with pytest.raises(GenesisError, match=f"^genesis rejected: {reason}: ") as e:
            verify_genesis_bytes(raw, "net-a")
        assert e.value.reason == reason
    with pytest.raises(GenesisError, match=r"^genesis rejected: unknown_signer: ") as e:
        verify_genesis_bytes(genesis(t).envelope, "net-a", expected_trainer=Identity.generate().public_hex)
    with pytest.raises(GenesisError, match=r"^genesis rejected: bad_signature: ") as e:
        verify_genesis_bytes(genesis(t).envelope, "net-b")
    assert e.value.reason == "bad_signature"
