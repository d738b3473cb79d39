"""Ed25519 node identity from a 32-byte seed.

One seed gives the signing key for envelopes and (in ``p2prl.net``) the libp2p peer id, so a
peer's network identity and its signing identity cannot diverge.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import nacl.exceptions
import nacl.signing

from p2prl.atomicfile import PRIVATE, write_atomic

SEED_BYTES = 32
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
KEY_FILE_FORMAT = "p2prl-ed25519-seed-v1"
_SEED_HEX = re.compile(r"[0-9a-f]{64}")  # the one spelling: bytes.fromhex would take "AB", " ab", "a b"


class KeyFileError(Exception):
    """A key file that is missing, malformed, or readable by others."""


@dataclass(frozen=True)
class Identity:
    """A node's Ed25519 key pair, derived from its seed."""

    seed: bytes

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_BYTES:
            raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(self.seed)}")

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(SEED_BYTES))

    @property
    def signing_key(self) -> nacl.signing.SigningKey:
        return nacl.signing.SigningKey(self.seed)

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @property
    def public_hex(self) -> str:
        return self.public_key.hex()

    def sign(self, message: bytes) -> bytes:
        return self.signing_key.sign(message).signature


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is ``public_key``'s Ed25519 signature of ``message``."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError, TypeError):
        return False
    return True


def save_identity(identity: Identity, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the seed to ``path`` with mode 0600, atomically; refuses to clobber unless asked."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise KeyFileError(f"{path} exists; refusing to overwrite a key")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": KEY_FILE_FORMAT, "seed": identity.seed.hex(), "public_key": identity.public_hex}
    write_atomic(path, (json.dumps(payload, indent=1) + "\n").encode(), mode=PRIVATE)
    return path


def load_identity(path: str | Path) -> Identity:
    """Read a key file; rejects one that group or others can read (as ssh does)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError as e:
        raise KeyFileError(f"no key file at {path}") from e
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{path} is accessible by group/others (mode {oct(st.st_mode & 0o777)}); chmod 600 it"
        )
    try:
        data = json.loads(path.read_text())
        if data.get("format") != KEY_FILE_FORMAT:
            raise KeyFileError(f"{path}: unknown key file format {data.get('format')!r}")
        seed_hex = data["seed"]
        if not isinstance(seed_hex, str) or _SEED_HEX.fullmatch(seed_hex) is None:
            raise KeyFileError(f"{path}: seed must be 64 lowercase hex characters")
        identity = Identity(bytes.fromhex(seed_hex))
    except KeyFileError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KeyFileError(f"{path}: malformed key file ({e})") from e
    if "public_key" in data and data["public_key"] != identity.public_hex:
        raise KeyFileError(f"{path}: public key does not match seed")
    return identity


def load_or_create_identity(path: str | Path) -> Identity:
    """The node's identity at ``path``, created on first start."""
    path = Path(path)
    if path.exists():
        return load_identity(path)
    identity = Identity.generate()
    save_identity(identity, path)
    return identity
