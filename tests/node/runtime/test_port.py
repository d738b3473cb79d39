"""The network port names only what the libp2p host has, and the in-process host has all of it."""

from pathlib import Path

from genesiskit import MODEL
from localnet import LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net.node import P2PNode
from p2prl.node.runtime.port import NetPort, RolePort
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.store import BlobStore


def test_hosts_implement_the_port(tmp_path: Path) -> None:
    me = Identity.generate()
    host = P2PNode(me, "net", BlobStore(tmp_path / "a"))  # not started: only its interface is checked
    local = LocalHub(genesis_from_spec(NetworkSpec(network_id="net"), me, MODEL)).join(me, BlobStore(tmp_path / "b"))
    for h in (host, local):
        assert isinstance(h, NetPort) and isinstance(h, RolePort)
    assert not isinstance(object(), RolePort)
