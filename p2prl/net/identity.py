"""The libp2p key pair and peer id of a node, from the same Ed25519 seed as its signing key."""

from __future__ import annotations

from typing import Any

from p2prl.crypto import Identity


def libp2p_key_pair(identity: Identity) -> Any:
    from libp2p.crypto.ed25519 import create_new_key_pair

    return create_new_key_pair(identity.seed)


def peer_id_for(identity: Identity) -> str:
    """Base58 libp2p peer id (12D3KooW…) of the identity's Ed25519 public key."""
    from libp2p.peer.id import ID

    return ID.from_pubkey(libp2p_key_pair(identity).public_key).to_base58()


def peer_id_of_public_key(public_key: bytes) -> str:
    """Base58 peer id of a raw Ed25519 public key (another node's, e.g. the trainer's from genesis)."""
    from libp2p.crypto.ed25519 import Ed25519PublicKey
    from libp2p.peer.id import ID

    return ID.from_pubkey(Ed25519PublicKey.from_bytes(public_key)).to_base58()


def public_key_of_peer_id(peer_id: str) -> bytes | None:
    """The Ed25519 public key inlined in an identity-multihash peer id, or None."""
    from libp2p.crypto.serialization import deserialize_public_key
    from libp2p.peer.id import ID

    try:
        mh = ID.from_base58(peer_id).to_bytes()
        # identity multihash: 0x00, varint length, protobuf-encoded public key
        if mh[0] != 0x00:
            return None
        key = deserialize_public_key(mh[2:])
        return key.to_bytes()
    except Exception:
        return None
