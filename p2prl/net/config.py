"""Settings of the network layer: where to listen, whom to dial, and every bound a peer can push on."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2prl.net.s3 import S3Config
from p2prl.protocol import MAX_ENVELOPE_BYTES


@dataclass
class Limits:
    """Bounds on what peers can make us hold or do; every one is counted when it bites."""

    max_msg_bytes: int = MAX_ENVELOPE_BYTES  # gossip payload; libp2p itself kills streams above 1 MiB
    peer_msgs_per_s: float = 50.0  # gossip messages a single forwarder may send us (token bucket)
    peer_msg_burst: int = 200
    unproven_msgs_per_s: float = 20.0  # gossip from all signers without standing together (charged before verify)
    unproven_burst: int = 60
    unproven_signer_per_s: float = 4.0  # of those, from one signer (an honest newcomer sends far less)
    unproven_signer_burst: int = 16
    standing_max: int = 8192  # signers remembered as in standing (a validator accepted their work)
    max_invalid_per_peer: int = 50  # invalid gossip messages before the forwarder is banned
    ban_s: float = 900.0  # how long a ban lasts
    incoming_queue: int = 4096  # verified messages waiting for poll()
    publish_queue: int = 1024  # our envelopes waiting to be paced out
    publish_per_s: float = 100.0  # pacing of our own publishes (libp2p's peer queues are 32 deep)
    topic_msgs_per_s: float = 1000.0  # gossipsub's own per-forwarder, per-topic limit (default 10/s)
    replay_window_s: float = 600.0
    replay_capacity: int = 65536
    max_serving_streams: int = 64  # concurrent inbound chunk streams
    max_streams_per_peer: int = 8  # of those, from one peer
    evict_idle_s: float = 0.5  # all taken: a newcomer evicts the stream idle longest, if idle this long
    max_partial_bytes: int = 16 * 1024**3  # partial downloads kept on disk for resumption
    max_providers: int = 16  # peers one download pulls from at once
    pipeline_depth: int = 3  # chunk requests in flight per provider (stream)


@dataclass
class RelayBounds:
    """What a relay node (``NetConfig.relay``) carries for others, at most."""

    max_reservations: int = 64  # slots; freed when their peer disconnects, or at the TTL
    reservation_ttl_s: int = 120  # holders refresh their slot well within it (relay.REFRESH_S)
    per_ip: int = 2  # slots held from one IP address
    per_subnet: int = 4  # slots held from one /24 (IPv4) or /48 (IPv6)
    circuits_per_peer: int = 4  # circuits open at once to one NATed peer
    circuit_bytes: int = 16 * 1024 * 1024  # both directions of one circuit together
    circuit_s: int = 3600
    peer_bytes_per_hour: int = 64 * 1024 * 1024  # relayed for one peer (either end) per hour
    max_tracked_peers: int = 4096


@dataclass
class NetConfig:
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    stream_timeout_s: float = 10.0  # every single stream operation (open, read, write)
    chunk_timeout_s: float = 10.0  # one chunk request, end to end
    hint_grace_s: float = 2.0  # a provider that delivers no chunk this long gives its slot up
    reserved_providers: list[str] = field(default_factory=list)  # always asked (the trainer's peer)
    s3_after_s: float = 3.0  # no peer progress for this long: take missing chunks from S3
    superseed: bool = False  # publishers: k-th upload of a chunk only k-1 cooldowns after the first
    superseed_cooldown_s: float = 10.0
    max_upload_bytes_per_s: float = 0.0  # cap on chunk bytes served per second; 0 = no cap
    relay: RelayBounds | None = None  # run a circuit relay for NATed peers, within these bounds
    hole_punch: bool = True  # DCUtR: upgrade relayed connections to direct ones where NATs allow
    mdns: bool = False  # find peers on the local network by multicast DNS
    gossip_degree: int = 6
    gossip_heartbeat_s: int = 1
    s3: S3Config | None = None
    # envelope type -> signer public keys allowed to sign it; types not listed are unrestricted
    allowed_signers: dict[str, set[bytes]] | None = None
