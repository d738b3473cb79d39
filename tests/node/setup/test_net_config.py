"""What a node asks of its network layer: the trainer superseeds, every role honours its upload cap
and mDNS setting, and no node lists itself among its bootstrap peers."""

from __future__ import annotations

from pathlib import Path

from p2prl.crypto.keys import Identity
from p2prl.net.identity import peer_id_for
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.netinit import NetworkSpec, base_model_info, genesis_from_spec
from p2prl.node.setup.netsettings import net_config


def test_net_config_per_role(tmp_path: Path, model_cache: Path) -> None:
    trainer = Identity.generate()
    me = Identity.generate()
    boot = "/ip4/127.0.0.1/tcp/4001/p2p/"
    spec = NetworkSpec(network_id="net-a", validators=[me.public_hex], bootstrap=[boot + peer_id_for(me)])
    sg = genesis_from_spec(spec, trainer, base_model_info(model_cache))

    def cfg(role: str, **kw: object) -> NodeConfig:
        return NodeConfig(role=role, network=tmp_path / "g.json", s3_enable=False, **kw)  # type: ignore[arg-type]

    t = net_config(cfg("trainer"), sg, trainer)
    assert t.superseed and t.superseed_cooldown_s == 1.0
    assert not net_config(cfg("trainer", superseed_s=0.0), sg, trainer).superseed
    assert net_config(cfg("trainer", superseed_s=2.5), sg, trainer).superseed_cooldown_s == 2.5
    for role in ("miner", "validator"):
        assert not net_config(cfg(role), sg, me).superseed  # they re-serve everything at once
    m = net_config(cfg("miner", max_upload_mb_s=5.0, mdns=True), sg, me)
    assert m.max_upload_bytes_per_s == 5e6 and m.mdns
    assert net_config(cfg("miner"), sg, me).max_upload_bytes_per_s == 0.0
    assert m.bootstrap == []  # its own address is not dialled
    assert net_config(cfg("miner"), sg, Identity.generate()).bootstrap == [boot + peer_id_for(me)]


def test_local_network_hint_for_loopback_and_private_bootstrap_peers() -> None:
    from p2prl.node.setup.netsettings import local_network_hint

    pid = "12D3KooWJHo1AfEBCvqXuEpFhTzoLr4dpkWkfJ4GoRrDR9cddL2X"
    off, on = NodeConfig(), NodeConfig(local_network=True)
    for host in ("127.0.0.1", "192.168.1.20", "10.0.0.5", "::1"):
        proto = "ip6" if ":" in host else "ip4"
        hint = local_network_hint(off, [f"/{proto}/{host}/tcp/4001/p2p/{pid}"])
        assert hint is not None and "--local-network" in hint and host in hint
        assert local_network_hint(on, [f"/{proto}/{host}/tcp/4001/p2p/{pid}"]) is None
    assert local_network_hint(off, [f"/ip4/93.184.216.34/tcp/4001/p2p/{pid}", f"/dns4/x.org/tcp/1/p2p/{pid}"]) is None
