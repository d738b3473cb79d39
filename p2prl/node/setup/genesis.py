"""The genesis file: the trainer-signed document that defines a network (DESIGN §1).

On disk it is JSON: the signed envelope (hex) plus a readable copy of its body. Only the envelope is
trusted; the copy is for people and must match it. A node verifies that the envelope is signed by the
key the body names as trainer, optionally that this key is the one the operator expects, and then
pins it in its data directory so a later start with a different genesis is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from p2prl.atomicfile import PUBLIC, write_atomic
from p2prl.crypto import EnvelopeError, Identity
from p2prl.protocol import Genesis, MessageError, decode_message, encode_message
from p2prl.protocol import sections as sec
from p2prl.reasons import InputReason

GENESIS_FORMAT = "p2prl-genesis-v1"
MAX_GENESIS_FILE = 1024 * 1024
PIN_FILE = "genesis.pin.json"


class GenesisError(Exception):
    """A genesis file that is malformed, not signed by its trainer, or not the one this node pinned.

    ``reason`` is the ``InputReason`` when the signed genesis itself was refused ("" for a file that
    could not be read or a pin that does not match): every rule a genesis breaks prints its code."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def _refused(reason: InputReason, detail: str) -> GenesisError:
    return GenesisError(f"genesis rejected: {reason}: {detail}", reason)


@dataclass(frozen=True)
class SignedGenesis:
    """A verified genesis with its envelope bytes (its digest identifies the network instance)."""

    genesis: Genesis
    envelope: bytes

    @property
    def network_id(self) -> str:
        return self.genesis.network_id

    @property
    def trainer_key(self) -> bytes:
        return bytes.fromhex(self.genesis.trainer)

    @property
    def validator_keys(self) -> frozenset[bytes]:
        return frozenset(bytes.fromhex(v) for v in self.genesis.validators)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.envelope).hexdigest()


def make_genesis(
    trainer: Identity,
    *,
    network_id: str,
    model: sec.ModelSpec,
    task: sec.TaskSpec,
    generation: sec.GenerationSpec,
    patch: sec.PatchSpec,
    validators: list[str],
    bootstrap: list[str],
    s3: sec.S3Spec | None,
    max_staleness: int,
    prompt: sec.PromptSpec | None = None,
    assets: tuple[sec.AssetSpec, ...] = (),
    proof: sec.ProofSpec | None = None,
) -> SignedGenesis:
    """Sign a genesis with the trainer's identity (the trainer key is the signer's)."""
    g = Genesis(
        network_id=network_id,
        trainer=trainer.public_hex,
        model=model,
        prompt=prompt or sec.PromptSpec(),
        task=task,
        generation=generation,
        patch=patch,
        validators=tuple(validators),
        bootstrap=tuple(bootstrap),
        s3=s3,
        max_staleness=max_staleness,
        assets=tuple(assets),
        proof=proof,
    )
    raw = encode_message(trainer, network_id, g)
    return verify_genesis_bytes(raw, network_id)


def verify_genesis_bytes(raw: bytes, network_id: str, expected_trainer: str = "") -> SignedGenesis:
    """Verify a genesis envelope; the signer must be the trainer it names (and the expected one, if given)."""
    try:
        env, msg = decode_message(raw, network_id, expected_type=Genesis.TYPE)
    except (EnvelopeError, MessageError) as e:
        raise GenesisError(f"genesis rejected: {e}", e.reason) from e
    assert isinstance(msg, Genesis)
    if msg.network_id != network_id:
        raise _refused(InputReason.BAD_NETWORK, f"genesis is for network {msg.network_id!r}, not {network_id!r}")
    if env.signer_hex != msg.trainer:
        raise _refused(InputReason.UNKNOWN_SIGNER, "genesis is not signed by the trainer key it names")
    if expected_trainer and msg.trainer != expected_trainer:
        raise _refused(
            InputReason.UNKNOWN_SIGNER,
            f"genesis trainer {msg.trainer[:16]}… is not the expected {expected_trainer[:16]}…",
        )
    if msg.trainer in msg.validators:
        raise _refused(InputReason.BAD_BODY, "the trainer cannot also be a validator")
    for named in (msg.model.files_sha256, msg.task.data_sha256):
        if named and not any(a.id == named for a in msg.assets):
            raise _refused(
                InputReason.BAD_BODY, f"the genesis names file blob {named[:12]}… but lists no such asset"
            )
    return SignedGenesis(genesis=msg, envelope=raw)


def write_genesis(sg: SignedGenesis, path: Path) -> Path:
    """Write the genesis file atomically; world-readable, as it is the network's public document."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": GENESIS_FORMAT,
        "network_id": sg.network_id,
        "envelope": sg.envelope.hex(),
        "genesis": sg.genesis.to_body(),
    }
    write_atomic(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(), mode=PUBLIC)
    return path


def read_genesis(path: Path, expected_trainer: str = "") -> SignedGenesis:
    """Read and verify a genesis file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_GENESIS_FILE:
            raise GenesisError(f"{path} is larger than {MAX_GENESIS_FILE} bytes")
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GenesisError(f"cannot read genesis {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != GENESIS_FORMAT:
        raise GenesisError(f"{path} is not a {GENESIS_FORMAT} file")
    network_id, env_hex = doc.get("network_id"), doc.get("envelope")
    if not isinstance(network_id, str) or not isinstance(env_hex, str):
        raise GenesisError(f"{path}: network_id and envelope must be strings")
    try:
        raw = bytes.fromhex(env_hex)
    except ValueError as e:
        raise GenesisError(f"{path}: envelope is not hex") from e
    sg = verify_genesis_bytes(raw, network_id, expected_trainer)
    if doc.get("genesis") != sg.genesis.to_body():
        raise GenesisError(f"{path}: the readable copy does not match the signed envelope")
    return sg


def pin_genesis(sg: SignedGenesis, data_dir: Path) -> None:
    """Record the genesis in ``data_dir`` on first start; refuse a different one later."""
    pin = Path(data_dir) / PIN_FILE
    record = {"network_id": sg.network_id, "trainer": sg.genesis.trainer, "digest": sg.digest}
    if pin.exists():
        try:
            held = json.loads(pin.read_text())
        except ValueError as e:
            raise GenesisError(f"{pin} is corrupt: {e}") from e
        if held.get("trainer") != record["trainer"]:
            raise GenesisError(
                f"this data directory is pinned to trainer {str(held.get('trainer'))[:16]}…; "
                f"the genesis names {record['trainer'][:16]}… (use another --data-dir)"
            )
        if held != record:
            raise GenesisError(
                f"this data directory belongs to another genesis ({pin}); use another --data-dir"
            )
        return
    pin.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(pin, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
