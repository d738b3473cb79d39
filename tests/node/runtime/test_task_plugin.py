"""A task from a plugin package, end to end: trainer, validator and miner as real processes.

The example plugin (examples/task-plugin, the one docs/TASKS.md walks through) is pip-installed into
a temporary directory; `p2prl network init --task subtraction` pins it in a genesis; every node is a
`p2prl node` process with that directory on its path. The miner's rollouts carry the plugin's rewards
and the validator, recomputing them with the plugin, accepts them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.crypto.keys import load_or_create_identity
from p2prl.dashboard import fetch_status
from p2prl.demo import Supervisor
from p2prl.net.identity import peer_id_for
from p2prl.net.ports import free_port
from p2prl.node.setup.genesis import read_genesis

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "task-plugin"
NODES = ("trainer", "validator", "miner1")


def pip_install_plugin(tmp_path: Path) -> Path:
    """``pip install --target`` of the example package (from a copy: the build leaves files behind)."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
    subprocess.run([*cmd, "--target", str(site), str(src)], check=True, capture_output=True, timeout=120)
    assert (site / "p2prl_example_task.py").exists()
    return site


def node_args(
    root: Path, name: str, genesis: Path, trainer_port: int, status_port: int, cache: Path
) -> list[str]:
    role = "miner" if name.startswith("miner") else name
    listen = f"/ip4/127.0.0.1/tcp/{trainer_port if role == 'trainer' else 0}"
    paths = ["--network", str(genesis), "--data-dir", str(root / name), "--model-cache", str(cache)]
    flags = f"--role {role} --listen {listen} --status-port {status_port} --torch-threads 1 --heartbeat-s 1 --local-network"
    return ["node", *paths, *flags.split(), "--no-s3-enable"]


def statuses(ports: dict[str, int]) -> dict[str, dict]:
    out = {}
    for name, port in ports.items():
        try:
            out[name] = fetch_status(f"http://127.0.0.1:{port}", timeout=2.0)
        except (OSError, ValueError):
            out[name] = {}
    return out


def test_plugin_task_pinned_in_genesis_and_used_by_every_role(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = pip_install_plugin(tmp_path)
    ids = {n: load_or_create_identity(tmp_path / n / "node.key") for n in NODES}
    port = free_port()
    genesis = tmp_path / "genesis.json"
    init = ["network", "init", "--out", str(genesis), "--key", str(tmp_path / "trainer" / "node.key")]
    init += ["--model-cache", str(model_cache), "--validator", str(tmp_path / "validator" / "node.key")]
    init += ["--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_for(ids['trainer'])}"]
    init += [
        "--task",
        "subtraction",
        "--task-param",
        "digits=1",
        "--network-id",
        "plugin-net",
        "--max-new-tokens",
        "4",
    ]
    init += ["--group-size", "4", "--groups-per-batch", "4", "--anchor-interval", "3"]

    # without the plugin installed the task is unknown: a one-line error, nothing written
    res = CliRunner().invoke(app, init)
    assert res.exit_code == 1 and "unknown task 'subtraction'" in res.output and not genesis.exists()
    monkeypatch.syspath_prepend(str(site))  # what `pip install` into this environment does
    res = CliRunner().invoke(app, init)
    assert res.exit_code == 0, res.output
    task = read_genesis(genesis).genesis.task
    assert (task.name, task.params) == ("subtraction", {"digits": 1})

    env = {
        "P2PRL_CACHE": str(model_cache),
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    ports = {n: free_port() for n in NODES}
    with Supervisor(tmp_path) as sup:
        for n in NODES:
            sup.spawn(n, node_args(tmp_path, n, genesis, port, ports[n], model_cache), env=env)
        deadline = time.monotonic() + 150
        st: dict[str, dict] = {}
        while time.monotonic() < deadline:
            st = statuses(ports)
            # a role reports its task once built (the trainer may still be loading when groups pass)
            accepted = st["validator"].get("counters", {}).get("groups_accepted", 0)
            # the score is written just after the counters: read both once the score shows the batch
            scored = st["validator"].get("scores", {}).get(ids["miner1"].public_hex, 0)
            if accepted > 0 and scored > 0 and all(s.get("task") for s in st.values()):
                break
            dead = [c for c in sup.children if not c.alive]
            assert not dead, "\n".join(f"{c.name} exited {c.proc.returncode}:\n{c.tail()}" for c in dead)
            time.sleep(1.0)
        logs = "\n".join(f"--- {c.name}\n{c.tail()}" for c in sup.children)
    v = st["validator"]
    assert v.get("counters", {}).get("groups_accepted", 0) > 0, (v.get("labelled"), logs)
    for n in NODES:  # every role built the genesis task, from the plugin
        assert st[n].get("task") == "subtraction", (n, {k: v for k, v in st[n].items() if k != "transfers"})
        assert st[n]["task_source"] == "p2prl_example_task:SubtractionTask"
    assert v["scores"].get(ids["miner1"].public_hex, 0) > 0
    assert not v.get("labelled", {}).get("rejected"), v["labelled"]  # no reward the validator disputes


def test_a_node_without_the_genesis_task_refuses_to_start(make_net) -> None:
    """A genesis naming a task this machine lacks (the plugin is not installed) stops every role at start."""
    from p2prl.node.run import NodeStartError, start_node

    net = make_net(("trainer", "validator", "miner1"), task="subtraction", task_params={"digits": 1})
    for name in ("trainer", "miner1"):
        with pytest.raises(NodeStartError, match="genesis task: unknown task 'subtraction'; known: addition"):
            start_node(net.config(name)).close()
