"""Identities (Ed25519 seeds), canonical encoding, and signed envelopes."""

from p2prl.crypto.canonical import CanonicalError, canonical_bytes, canonical_loads
from p2prl.crypto.envelope import MAGIC, Envelope, EnvelopeError, claimed_signer, open_envelope, seal
from p2prl.crypto.keys import Identity, KeyFileError, load_identity, load_or_create_identity, save_identity
from p2prl.crypto.replay import ReplayGuard

__all__ = [
    "MAGIC",
    "CanonicalError",
    "Envelope",
    "EnvelopeError",
    "Identity",
    "KeyFileError",
    "ReplayGuard",
    "canonical_bytes",
    "canonical_loads",
    "claimed_signer",
    "load_identity",
    "load_or_create_identity",
    "open_envelope",
    "save_identity",
    "seal",
]
