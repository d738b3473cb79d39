"""The node's commands: help, network init/show, refusals at start, dashboard --once."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.crypto.keys import Identity, save_identity
from p2prl.node.runtime.http import StatusServer
from p2prl.node.runtime.status import NodeStatus
from p2prl.node.setup.config import NodeConfig

runner = CliRunner()


@pytest.fixture(scope="module")
def model_cache() -> Path:
    from p2prl.node.setup.netinit import base_model_info
    from p2prl.rl.local import default_cache_dir

    cache = default_cache_dir()
    base_model_info(cache)
    return cache


def test_node_help_lists_every_setting() -> None:
    res = runner.invoke(app, ["node", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for name in NodeConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in res.output, name
    assert "P2PRL_DATA_DIR" in res.output and "--config" in res.output


def test_node_help_fits_80_columns() -> None:
    res = runner.invoke(app, ["node", "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    lines = res.output.splitlines()
    # was 295 lines with names cut; about two lines a setting now (engine choice and reports added 4)
    assert len(lines) < 150 and max(map(len, lines)) <= 80, len(lines)
    assert "<bool>" not in res.output and "--calibrate-tolerances / --no-calibrate-tolerances" in res.output
    for name in NodeConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in res.output, name


def test_node_needs_network(tmp_path: Path) -> None:
    res = runner.invoke(app, ["node", "--data-dir", str(tmp_path)], env={})
    assert res.exit_code == 2 and "network" in res.output


def test_network_init_show_and_start_refusals(tmp_path: Path, model_cache: Path) -> None:
    validator = Identity.generate()
    save_identity(validator, tmp_path / "v.key")
    g = tmp_path / "genesis.json"
    res = runner.invoke(
        app,
        [
            "network",
            "init",
            "--out",
            str(g),
            "--key",
            str(tmp_path / "t.key"),
            "--network-id",
            "cli-net",
            "--model-cache",
            str(model_cache),
            "--validator",
            str(tmp_path / "v.key"),
            "--s3-bucket",
            "b",
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["network", "show", str(g)])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["validators"] == [validator.public_hex] and shown["s3"]["bucket"] == "b"
    # a node whose key is not a listed validator cannot act as one
    res = runner.invoke(
        app, ["node", "--role", "validator", "--network", str(g), "--data-dir", str(tmp_path / "n1")]
    )
    assert res.exit_code == 1 and "cannot act as validator" in res.output
    # a genesis signed by someone else than the expected trainer is refused
    res = runner.invoke(
        app, ["node", "--network", str(g), "--data-dir", str(tmp_path / "n2"), "--trainer-key", "ab" * 32]
    )
    assert res.exit_code == 1 and "expected" in res.output
    doc = json.loads(g.read_text())
    doc["genesis"]["max_staleness"] += 1
    g.write_text(json.dumps(doc))
    res = runner.invoke(app, ["network", "show", str(g)])
    assert res.exit_code == 1 and "readable copy" in res.output


def test_dashboard_once() -> None:
    s = NodeStatus("miner", "ab" * 32, "net")
    s.set(version=4, trainer_version=4)
    server = StatusServer(s).start()
    try:
        res = runner.invoke(app, ["dashboard", "--node", server.url, "--once"], env={"COLUMNS": "160"})
        assert res.exit_code == 0, res.output
        assert "miner" in res.output and "abababab" in res.output
    finally:
        server.stop()
    assert runner.invoke(app, ["dashboard"]).exit_code == 2


def test_network_init_pins_task_params_and_data_hash(tmp_path: Path, model_cache: Path) -> None:
    from p2prl.rl.tasks import file_sha256

    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    g = tmp_path / "genesis.json"
    base = ["network", "init", "--out", str(g), "--key", str(tmp_path / "t.key")]
    base += ["--model-cache", str(model_cache), "--task"]
    for args, why in [
        (["addition", "--task-param", "digts=3"], "takes no parameter digts; it takes: digits"),
        (["addition", "--task-param", "digits"], "not NAME=VALUE"),
        (
            ["gsm8k", "--task-param", f"path={data}", "--task-param", f"data_sha256={'0' * 64}"],
            "genesis pins",
        ),
    ]:
        res = runner.invoke(app, base + args)
        assert res.exit_code == 1 and why in res.output and not g.exists(), res.output
    res = runner.invoke(
        app, [*base, "gsm8k", "--task-param", f"path={data}", "--task-param", "max_records=5"]
    )
    assert res.exit_code == 0, res.output
    task = json.loads(runner.invoke(app, ["network", "show", str(g)]).output)["task"]
    assert task == {
        "name": "gsm8k",
        "params": {"path": str(data), "max_records": 5, "data_sha256": file_sha256(data)},
        "data_sha256": file_sha256(data),  # the task_data asset: a node without the file fetches it
    }


def test_network_init_refuses_bad_bootstrap_and_warns_without_validators(
    tmp_path: Path, model_cache: Path
) -> None:
    from p2prl.net.identity import peer_id_for

    g = tmp_path / "genesis.json"
    base = ["network", "init", "--out", str(g), "--key", str(tmp_path / "t.key")]
    base += ["--model-cache", str(model_cache)]
    for bad in ("127.0.0.1:4001", "/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.1/tcp/99999/p2p/" + "a" * 46):
        res = runner.invoke(app, [*base, "--bootstrap", bad])
        assert res.exit_code == 1 and "is not a multiaddr like" in res.output, res.output
        assert not g.exists()
    peer = peer_id_for(Identity.generate())
    res = runner.invoke(app, [*base, "--bootstrap", f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}"])
    assert res.exit_code == 0 and g.exists(), res.output
    assert "warning: no --validator" in res.output  # legal, but that network can never train


@pytest.mark.slow
def test_network_init_pins_the_reference_runs_tolerances(tmp_path: Path, model_cache: Path) -> None:
    """``--pin-tolerances hf``: a reference run on the genesis model before signing, its tolerances
    (never below calibration's floors) signed into the genesis; an unknown engine writes nothing."""
    from p2prl.node.setup.genesis import read_genesis
    from p2prl.proof import ValidatorConfig

    g = tmp_path / "genesis.json"
    base = ["network", "init", "--out", str(g), "--key", str(tmp_path / "t.key"), "--model-cache", str(model_cache)]
    res = runner.invoke(app, [*base, "--pin-tolerances", "hf,tpu"])
    assert res.exit_code == 1 and "reference engines must be among hf, vllm" in res.output and not g.exists()
    res = runner.invoke(app, [*base, "--pin-tolerances", "hf"])
    assert res.exit_code == 0 and "tolerances pinned (hf-cpu" in res.output, res.output
    proof = json.loads(runner.invoke(app, ["network", "show", str(g)]).output)["proof"]
    assert proof["engines"] == ["hf-cpu"] and proof["tokens"] >= 100
    assert proof["sampling_margin_ppm"] >= 2000 and proof["fingerprint_tol_ppm"] >= 6000
    cfg = ValidatorConfig.from_genesis(read_genesis(g).genesis)
    assert cfg.sampling_margin == proof["sampling_margin_ppm"] / 1e6 < 0.05  # not the cross-engine default
