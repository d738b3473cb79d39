"""A task's data file travels as a genesis asset: `network init --task gsm8k --task-param path=FILE` pins
it; the trainer serves it; a validator and a miner whose machines lack the file (one holding a tampered
copy where the fetched one goes) fetch it from the trainer, verify it and build the task from it. Every
node is a `p2prl node` process."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from test_task_plugin import node_args, statuses
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.crypto.keys import load_or_create_identity
from p2prl.demo import Supervisor
from p2prl.net.identity import peer_id_for
from p2prl.net.ports import free_port
from p2prl.node.setup.genesis import read_genesis

pytestmark = pytest.mark.slow

NODES = ("trainer", "validator", "miner1")


def _records(n: int) -> bytes:
    rows = [{"question": f"What is {i} plus {i + 1}?", "answer": f"#### {2 * i + 1}"} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _wait(ports: dict[str, int], names: tuple[str, ...], sup: Supervisor, done, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    st: dict[str, dict] = {}
    while time.monotonic() < deadline:
        st = statuses({n: ports[n] for n in names})
        if done(st):
            return st
        dead = [c for c in sup.children if not c.alive]
        assert not dead, "\n".join(f"{c.name} exited {c.proc.returncode}:\n{c.tail()}" for c in dead)
        time.sleep(1.0)
    raise AssertionError(f"timed out: {st}\n" + "\n".join(f"--- {c.name}\n{c.tail()}" for c in sup.children))


def test_task_data_file_fetched_by_nodes_without_it(tmp_path: Path, model_cache: Path) -> None:
    data = _records(40)
    sha = hashlib.sha256(data).hexdigest()
    src = tmp_path / "operator" / "gsm8k-train.jsonl"
    src.parent.mkdir()
    src.write_bytes(data)
    ids = {n: load_or_create_identity(tmp_path / n / "node.key") for n in NODES}
    port = free_port()
    genesis = tmp_path / "genesis.json"
    init = ["network", "init", "--out", str(genesis), "--key", str(tmp_path / "trainer" / "node.key")]
    init += ["--model-cache", str(model_cache), "--validator", str(tmp_path / "validator" / "node.key")]
    init += ["--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_for(ids['trainer'])}"]
    init += ["--task", "gsm8k", "--task-param", f"path={src}", "--network-id", "data-net"]
    init += ["--max-new-tokens", "4", "--group-size", "4", "--groups-per-batch", "2"]
    res = CliRunner().invoke(app, init)
    assert res.exit_code == 0, res.output
    g = read_genesis(genesis).genesis
    assert g.task.data_sha256 == sha == g.task.params["data_sha256"]
    assert [(a.name, a.size) for a in g.assets if a.id == sha] == [("task_data", len(data))]

    # a tampered copy where the miner keeps fetched files: never read, replaced by the verified one
    tampered = tmp_path / "miner1" / "assets" / sha[:32] / src.name
    tampered.parent.mkdir(parents=True)
    bad = data.replace(b'"#### 1"', b'"#### 2"')
    assert bad != data and len(bad) == len(data)
    tampered.write_bytes(bad)
    ports = {n: free_port() for n in NODES}
    with Supervisor(tmp_path) as sup:
        sup.spawn("trainer", node_args(tmp_path, "trainer", genesis, port, ports["trainer"], model_cache))
        _wait(ports, ("trainer",), sup, lambda st: st["trainer"].get("task") == "gsm8k", 120)
        src.unlink()  # the file exists nowhere but in the trainer's blob store now
        for n in NODES[1:]:
            sup.spawn(n, node_args(tmp_path, n, genesis, port, ports[n], model_cache))

        def done(st: dict) -> bool:
            built = all(st[n].get("task") == "gsm8k" for n in NODES)
            return built and st["validator"].get("counters", {}).get("groups_accepted", 0) > 0

        st = _wait(ports, NODES, sup, done, 180)
    for n in NODES[1:]:
        assert st[n]["labelled"].get("assets_fetched", {}).get("task_data") == 1, {k: v for k, v in st[n].items() if k != "transfers"}
        copy = tmp_path / n / "assets" / sha[:32] / src.name
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == sha
    assert not st["validator"].get("labelled", {}).get("rejected"), st["validator"]["labelled"]
