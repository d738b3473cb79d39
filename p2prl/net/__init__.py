"""libp2p transport, gossip, chunk exchange, swarm downloads and the S3 fallback.

The host (``P2PNode``: trio and libp2p) loads on first use; configuration, identities and topics do
not need it (the network simulator imports them).
"""

from typing import TYPE_CHECKING

from p2prl.lazyexports import lazy_exports
from p2prl.net.config import Limits, NetConfig, RelayBounds
from p2prl.net.dialer import Dialer, DialHost
from p2prl.net.gossip import Incoming
from p2prl.net.identity import peer_id_for, peer_id_of_public_key
from p2prl.net.pacing import UploadPacer
from p2prl.net.ports import free_port
from p2prl.net.s3 import S3Config, S3Mirror, public_read_policy
from p2prl.net.topics import topic

if TYPE_CHECKING:
    from p2prl.net.node import P2PNode

__all__ = [
    "DialHost",
    "Dialer",
    "Incoming",
    "Limits",
    "NetConfig",
    "P2PNode",
    "RelayBounds",
    "S3Config",
    "S3Mirror",
    "UploadPacer",
    "free_port",
    "peer_id_for",
    "peer_id_of_public_key",
    "public_read_policy",
    "topic",
]

__getattr__ = lazy_exports(__name__)
