"""Shared fixtures: small networks on 127.0.0.1 (the base model is the root conftest's `model_cache`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from p2prl.crypto.keys import Identity, load_or_create_identity
from p2prl.net.identity import peer_id_for
from p2prl.net.ports import free_port
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import write_genesis
from p2prl.node.setup.netinit import NetworkSpec, describe_model, genesis_from_spec


@dataclass
class Net:
    root: Path
    genesis: Path
    ids: dict[str, Identity]
    trainer_port: int
    model_cache: Path

    def config(self, name: str, **kw: object) -> NodeConfig:
        role = "miner" if name.startswith("miner") else name
        port = self.trainer_port if role == "trainer" else 0
        settings: dict[str, object] = {
            "role": role,
            "network": self.genesis,
            "data_dir": self.root / name,
            "listen": f"/ip4/127.0.0.1/tcp/{port}",
            "model_cache": self.model_cache,
            "s3_enable": False,
            "heartbeat_s": 1.0,
            "local_network": True,  # every node here is on 127.0.0.1
            "status_port": -1,
            **kw,
        }
        return NodeConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
def make_net(tmp_path: Path, model_cache: Path) -> Callable[..., Net]:
    def make(names: tuple[str, ...] = ("trainer", "validator", "miner1"), **spec_kw: object) -> Net:
        ids = {n: load_or_create_identity(tmp_path / n / "node.key") for n in names}
        port = free_port()
        kw: dict[str, object] = {
            "network_id": "test-net",
            "validators": [ids[n].public_hex for n in names if n.startswith("validator")],
            "bootstrap": [f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_for(ids['trainer'])}"],
            "max_new_tokens": 4,
            "group_size": 4,
            "groups_per_batch": 4,
            "anchor_interval": 3,
            "chunk_size": 64 * 1024,
            **spec_kw,
        }
        spec = NetworkSpec(**kw)
        model, stops, assets = describe_model(spec, model_cache)
        sg = genesis_from_spec(spec, ids["trainer"], model, stop_token_ids=stops, assets=assets)
        g = write_genesis(sg, tmp_path / "genesis.json")
        return Net(tmp_path, g, ids, port, model_cache)

    return make


@pytest.fixture
def wait_for() -> Callable[..., None]:
    return _wait_for


def _wait_for(pred: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
