"""Identities (Ed25519 seeds), canonical encoding, and signed envelopes."""

from p2prl.crypto.canonical import CanonicalError, canonical_bytes, canonical_loads
from p2prl.crypto.envelope import Envelope, EnvelopeError, open_envelope, seal
from p2prl.crypto.keys import Identity, KeyFileError, load_identity, save_identity

__all__ = [
    "CanonicalError",
    "Envelope",
    "EnvelopeError",
    "Identity",
    "KeyFileError",
    "canonical_bytes",
    "canonical_loads",
    "load_identity",
    "open_envelope",
    "save_identity",
    "seal",
]
