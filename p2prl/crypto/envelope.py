"""Signed envelopes: the only form in which control objects cross the wire.

Byte layout (docs/PROTOCOL.md §Envelope)::

    magic  4   b"P2E\\x01"
    tlen   1   length of type, 1..32
    type   tlen  ASCII [a-z0-9_]
    signer 32  Ed25519 public key
    blen   4   uint32 big-endian body length
    body   blen  canonical JSON (p2prl.crypto.canonical)
    sig    64  Ed25519 signature of DOMAIN || u8 len(network) || network || u8 tlen || type || body

The network id is signed but not carried: a signature made for one network never verifies in
another, and the type is signed so a body cannot be replayed as a different object.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any

from p2prl.crypto.canonical import CanonicalError, canonical_bytes, canonical_loads
from p2prl.crypto.keys import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature
from p2prl.errors import PeerInputError
from p2prl.reasons import InputReason

MAGIC = b"P2E\x01"
DOMAIN = b"p2prl/envelope/v1\x00"
MAX_TYPE_LEN = 32
MAX_NETWORK_LEN = 64
DEFAULT_MAX_ENVELOPE_BYTES = 256 * 1024
_TYPE_RE = re.compile(rb"^[a-z0-9_]{1,32}$")
_HEADER = 4 + 1


class EnvelopeError(PeerInputError, ValueError):
    """Why an envelope was rejected; ``reason`` is an ``InputReason`` for counters and logs."""


@dataclass(frozen=True)
class Envelope:
    """A verified envelope: who signed what, of which type."""

    type: str
    signer: bytes
    body: dict[str, Any]
    body_bytes: bytes
    signature: bytes
    raw: bytes

    @property
    def signer_hex(self) -> str:
        return self.signer.hex()

    @property
    def digest(self) -> bytes:
        """sha256 of the whole envelope: the id used to drop replays and duplicates."""
        return hashlib.sha256(self.raw).digest()


def _signed_message(network: str, type_: bytes, body: bytes) -> bytes:
    net = network.encode()
    if not 0 < len(net) <= MAX_NETWORK_LEN:
        raise EnvelopeError(InputReason.BAD_NETWORK, f"network id must be 1..{MAX_NETWORK_LEN} bytes")
    return DOMAIN + bytes([len(net)]) + net + bytes([len(type_)]) + type_ + body


def seal(identity: Identity, network: str, type_: str, body: dict[str, Any]) -> bytes:
    """Encode and sign ``body`` as an envelope of ``type_`` for ``network``."""
    t = type_.encode()
    if not _TYPE_RE.match(t):
        raise EnvelopeError(InputReason.BAD_TYPE, f"type {type_!r} must match [a-z0-9_]{{1,32}}")
    if not isinstance(body, dict):
        raise EnvelopeError(InputReason.BAD_BODY, "body must be an object")
    try:
        b = canonical_bytes(body)
    except CanonicalError as e:
        raise EnvelopeError(InputReason.BAD_BODY, e.detail) from e
    sig = identity.sign(_signed_message(network, t, b))
    return MAGIC + bytes([len(t)]) + t + identity.public_key + struct.pack(">I", len(b)) + b + sig


def claimed_signer(data: bytes) -> bytes | None:
    """The signer key an envelope names, read from its header without verifying anything (None if
    the header is malformed): for budgets charged before the signature check, which a forger
    naming another key still has to pass."""
    if len(data) < _HEADER or data[:4] != MAGIC:
        return None
    pos = _HEADER + data[4]
    signer = bytes(data[pos : pos + PUBLIC_KEY_BYTES])
    return signer if len(signer) == PUBLIC_KEY_BYTES else None


def open_envelope(
    data: bytes,
    network: str,
    *,
    max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
    expected_type: str | None = None,
    allowed_signers: set[bytes] | frozenset[bytes] | None = None,
) -> Envelope:
    """Parse and verify; raises EnvelopeError with a reason code on anything wrong.

    Checks, in order: size, magic, framing, type, signer allow-list, signature, canonical body.
    Nothing is parsed from the body before the signature verifies.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EnvelopeError(InputReason.MALFORMED, "not bytes")
    data = bytes(data)
    if len(data) > max_bytes:
        raise EnvelopeError(InputReason.OVERSIZED, f"{len(data)} > {max_bytes} bytes")
    if len(data) < _HEADER or data[:4] != MAGIC:
        raise EnvelopeError(InputReason.BAD_MAGIC, "not a p2prl envelope or unsupported version")
    tlen = data[4]
    pos = _HEADER
    if not 1 <= tlen <= MAX_TYPE_LEN or len(data) < pos + tlen + PUBLIC_KEY_BYTES + 4:
        raise EnvelopeError(InputReason.TRUNCATED, "header shorter than declared")
    t = data[pos : pos + tlen]
    pos += tlen
    signer = data[pos : pos + PUBLIC_KEY_BYTES]
    pos += PUBLIC_KEY_BYTES
    (blen,) = struct.unpack(">I", data[pos : pos + 4])
    pos += 4
    if len(data) != pos + blen + SIGNATURE_BYTES:
        short = len(data) < pos + blen + SIGNATURE_BYTES
        kind = InputReason.TRUNCATED if short else InputReason.TRAILING_BYTES
        raise EnvelopeError(kind, f"length {len(data)} does not match declared body of {blen} bytes")
    if not _TYPE_RE.match(t):
        raise EnvelopeError(InputReason.BAD_TYPE, repr(t))
    type_ = t.decode()
    if expected_type is not None and type_ != expected_type:
        raise EnvelopeError(InputReason.UNEXPECTED_TYPE, f"{type_} where {expected_type} was expected")
    body_bytes = data[pos : pos + blen]
    sig = data[pos + blen :]
    if allowed_signers is not None and signer not in allowed_signers:
        raise EnvelopeError(InputReason.UNKNOWN_SIGNER, signer.hex()[:16])
    if not verify_signature(signer, _signed_message(network, t, body_bytes), sig):
        raise EnvelopeError(InputReason.BAD_SIGNATURE, f"{type_} from {signer.hex()[:16]}")
    try:
        body = canonical_loads(body_bytes)
    except CanonicalError as e:
        raise EnvelopeError(InputReason.BAD_BODY, e.detail) from e
    if not isinstance(body, dict):
        raise EnvelopeError(InputReason.BAD_BODY, "body is not an object")
    return Envelope(type=type_, signer=signer, body=body, body_bytes=body_bytes, signature=sig, raw=data)
