"""Starting a node: verify the genesis, load the identity, open the store, start the network host."""

from __future__ import annotations

import logging

from p2prl.crypto import Identity, KeyFileError, load_or_create_identity
from p2prl.net import topic
from p2prl.node.runtime.journal import journaled
from p2prl.node.runtime.role import NodeStartError
from p2prl.node.runtime.runtime import NodeRuntime
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import GenesisError, SignedGenesis, pin_genesis, read_genesis
from p2prl.node.setup.netsettings import local_network_hint, net_config
from p2prl.store import BlobStore

log = logging.getLogger(__name__)


def load_genesis_for(cfg: NodeConfig) -> tuple[Identity, SignedGenesis]:
    """The node's identity and its verified, pinned genesis; NodeStartError if its key cannot act
    as its role there."""
    assert cfg.network is not None
    try:
        sg = read_genesis(cfg.network, cfg.trainer_key)
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        pin_genesis(sg, cfg.data_dir)
        identity = load_or_create_identity(cfg.key_path)
    except (GenesisError, KeyFileError) as e:
        raise NodeStartError(str(e)) from e
    role_ok = {
        "trainer": identity.public_key == sg.trainer_key,
        "validator": identity.public_key in sg.validator_keys,
        "miner": identity.public_key != sg.trainer_key and identity.public_key not in sg.validator_keys,
    }
    if not role_ok[cfg.role]:
        raise NodeStartError(
            f"key {identity.public_hex[:16]}… cannot act as {cfg.role} in this network "
            "(the trainer key is in genesis; validators are listed there; miners are neither)"
        )
    return identity, sg


def build_runtime(cfg: NodeConfig) -> NodeRuntime:
    """Verify genesis, load the identity, open the store and start the network host."""
    from p2prl.net import P2PNode  # trio and libp2p load only when a host starts

    identity, sg = load_genesis_for(cfg)
    store = BlobStore(cfg.data_dir / "blobs", cfg.store_max_bytes)
    net_cfg = net_config(cfg, sg, identity)
    hint = local_network_hint(cfg, [*sg.genesis.bootstrap, *cfg.bootstrap])
    if hint:
        log.warning("%s", hint)
    net = P2PNode(identity, sg.network_id, store, net_cfg)
    status = NodeStatus(cfg.role, identity.public_hex, sg.network_id)
    try:
        net.start()
    except RuntimeError as e:
        raise NodeStartError(f"network host failed to start: {e}") from e
    status.set(peer_id=net.peer_id, addrs=list(net.addrs))
    for t in (
        "manifests",
        "rollouts",
        "verdicts",
        "heartbeats",
    ):
        net.subscribe(topic(sg.network_id, t))
    if cfg.journal_bytes > 0:  # announcements, verdicts and scores in and out, kept on disk
        return NodeRuntime(cfg, sg, identity, store, journaled(net, cfg.data_dir, cfg.journal_bytes), status)
    return NodeRuntime(cfg, sg, identity, store, net, status)

