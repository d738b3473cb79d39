"""The network layer's settings for a node: from its verified genesis and its own flags."""

from __future__ import annotations

import ipaddress
import os

from p2prl.crypto import Identity
from p2prl.net import NetConfig, RelayBounds, S3Config, peer_id_for, peer_id_of_public_key
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import SignedGenesis
from p2prl.protocol import Genesis, PatchManifest, Receipts, S3Spec, Scores, Verdict


def allowed_signers(sg: SignedGenesis) -> dict[str, set[bytes]]:
    """Who may sign what: manifests, receipts and genesis the trainer, verdicts and scores the genesis
    validators."""
    validators = set(sg.validator_keys)
    return {
        PatchManifest.TYPE: {sg.trainer_key},
        Receipts.TYPE: {sg.trainer_key},
        Genesis.TYPE: {sg.trainer_key},
        Verdict.TYPE: validators,
        Scores.TYPE: validators,
    }


def s3_config(cfg: NodeConfig, sg: SignedGenesis) -> S3Config | None:
    """The S3 settings: genesis location, overridden by the node's own flags; None when disabled."""
    if not cfg.s3_enable:
        return None

    g = sg.genesis.s3 or S3Spec()
    bucket = cfg.s3_bucket or g.bucket
    if not bucket:
        return None

    endpoint = (cfg.s3_endpoint or g.endpoint) or None
    # credentials sign only requests to the endpoint this node's operator named, never to one that
    # only the genesis (whoever wrote it) names (docs/SECURITY.md, item 20)
    sign = cfg.s3_sign and endpoint == (cfg.s3_endpoint or None)
    return S3Config(
        bucket=bucket,
        endpoint_url=endpoint,
        prefix=cfg.s3_prefix or g.prefix,
        region=cfg.s3_region or g.region,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") if sign else None,
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") if sign else None,
    )


def net_config(cfg: NodeConfig, sg: SignedGenesis, identity: Identity) -> NetConfig:
    """The network layer's settings for this node: bootstrap peers (without itself), S3, who may sign
    what, and the trainer's superseeding (its uplink is the scarce one)."""
    bootstrap = [a for a in [*sg.genesis.bootstrap, *cfg.bootstrap] if not a.endswith(_peer_suffix(identity))]
    return NetConfig(
        listen=cfg.listen,
        bootstrap=bootstrap,
        s3=s3_config(cfg, sg),
        allowed_signers=allowed_signers(sg),
        superseed=cfg.superseed_s > 0 and cfg.role == "trainer",
        superseed_cooldown_s=cfg.superseed_s or 1.0,
        max_upload_bytes_per_s=cfg.max_upload_mb_s * 1e6,
        mdns=cfg.mdns,
        relay=RelayBounds() if cfg.relay_service else None,
        reserved_providers=_reserved_providers(sg, identity),
    )


def _reserved_providers(sg: SignedGenesis, identity: Identity) -> list[str]:
    """The peers every download asks, whatever else claims a blob: the trainer (it holds every patch)
    and the genesis validators (they hold every rollout batch they judged and every patch)."""
    keys = [sg.trainer_key, *sg.validator_keys]
    return [peer_id_of_public_key(k) for k in dict.fromkeys(keys) if k != identity.public_key]


def _peer_suffix(identity: Identity) -> str:
    return "/p2p/" + peer_id_for(identity)


def local_network_hint(cfg: NodeConfig, bootstrap: list[str]) -> str | None:
    """A line for a node about to run without ``--local-network`` whose bootstrap peers are on this
    machine or a private network: it would reach them, but nobody would fetch from it (peers
    announce loopback and private addresses, dialled only on a local network), so every one of its
    rollout batches would be rejected as ``unreachable``. None when the setting fits."""
    if cfg.local_network:
        return None
    for addr in bootstrap:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            try:
                ip = ipaddress.ip_address(parts[2])
            except ValueError:
                continue
            if not ip.is_global:  # what the dialer dials only on a local network (net/dialer.py)
                return (
                    f"bootstrap peer {parts[2]} is on this machine or a private network: for a network "
                    "on one machine or a LAN, start every node with --local-network (without it, "
                    "peers do not dial each other's addresses there)"
                )
    return None
