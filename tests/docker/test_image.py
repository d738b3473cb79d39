"""The CPU image, built and run for real: a miner in a container joins a network on the host.

Needs a Docker Engine (``scripts/bootstrap.sh test`` installs and starts one when run as root);
skipped with the reason otherwise. One build (``docker/build.sh cpu``: cached base and wheels make
a rebuild fast), then short runs: the CLI as the image's non-root user, a miner container syncing
with a trainer and a validator that run on the host and getting its rollouts accepted, a restart
that keeps its key and data, and the HEALTHCHECK turning healthy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("P2PRL_TEST_IMAGE", "p2prl:cpu")
PREFIX = f"p2prl-dtest-{uuid.uuid4().hex[:8]}"  # every container and volume made here

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _docker() -> str | None:
    # Debian's 20.10 client builds with BuildKit natively; any client runs containers
    return shutil.which("/usr/bin/docker") or shutil.which("docker")


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _engine_problem() -> str | None:
    if DOCKER is None:
        return "no docker client (apt-get install docker.io; bash scripts/bootstrap.sh test does it as root)"
    try:
        info = subprocess.run(
            [DOCKER, "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker version failed: {e}"
    if info.returncode != 0:
        why = info.stderr.decode(errors="replace").strip()[-200:]
        return f"no Docker Engine answers ({why}); bash scripts/bootstrap.sh test starts one as root"
    return None


DOCKER = _docker() or ""


@pytest.fixture(scope="module")
def image() -> str:
    problem = _engine_problem()
    if problem:
        pytest.skip(problem)
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(ROOT / "docker" / "build.sh"), "cpu"],
        env={**os.environ, "P2PRL_TAG": IMAGE},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(f"build: {time.monotonic() - t0:.0f} s; {proc.stdout.strip().splitlines()[-1]}")
    return IMAGE


@pytest.fixture(scope="module")
def cleanup() -> Iterator[list[tuple[str, str]]]:
    made: list[tuple[str, str]] = []  # ("container" | "volume", name)
    yield made
    for kind, name in reversed(made):
        if kind == "container":
            docker("rm", "-f", "-v", name, check=False)
        else:
            docker("volume", "rm", "-f", name, check=False)


def test_cli_runs_as_the_unprivileged_user(image: str, cleanup: list[tuple[str, str]]) -> None:
    keys = f"{PREFIX}-cli-keys"
    cleanup.append(("volume", keys))
    assert "Usage" in docker("run", "--rm", image, "--help").stdout
    assert docker("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip() == "10001"
    docker("run", "--rm", "-v", f"{keys}:/keys", image, "keys", "generate", "--out", "/keys/node.key")
    shown = json.loads(
        docker("run", "--rm", "-v", f"{keys}:/keys", image, "keys", "show", "/keys/node.key", "--json").stdout
    )
    assert shown["peer_id"]
    # the key belongs to the image's user and nobody else may read it
    mode = docker(
        "run", "--rm", "-v", f"{keys}:/keys", "--entrypoint", "stat", image, "-c", "%u %a", "/keys/node.key"
    )
    uid, perms = mode.stdout.split()
    assert uid == "10001" and perms.endswith("00"), mode.stdout


def _bridge_gateway() -> str:
    """The host's address on Docker's default bridge (its gateway: the subnet's first address)."""
    import ipaddress

    ipam = json.loads(docker("network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}").stdout)
    conf = next(c for c in ipam if ":" not in c.get("Subnet", ":"))
    return conf.get("Gateway") or str(next(ipaddress.ip_network(conf["Subnet"]).hosts()))


def _status(port: int) -> dict | None:
    from p2prl.dashboard import fetch_status

    try:
        return fetch_status(f"http://127.0.0.1:{port}", timeout=2.0)
    except (OSError, ValueError):
        return None


def _wait(pred, timeout: float, what: str, detail=lambda: "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}\n{detail()}")


def test_miner_container_joins_a_host_network(
    image: str, cleanup: list[tuple[str, str]], tmp_path: Path
) -> None:
    """Trainer and validator on the host, the miner in a container on Docker's bridge network."""
    from p2prl.crypto.keys import load_or_create_identity
    from p2prl.demo import Supervisor
    from p2prl.net.identity import peer_id_for
    from p2prl.net.ports import free_port
    from p2prl.node.setup.genesis import write_genesis
    from p2prl.node.setup.netinit import NetworkSpec, base_model_info, genesis_from_spec
    from p2prl.rl.local import default_cache_dir

    gw = _bridge_gateway()
    # the base model, readable by the container's user (the host cache is private to its owner)
    model = tmp_path / "model"
    info = base_model_info(default_cache_dir())
    shutil.copytree(default_cache_dir(), model, ignore=shutil.ignore_patterns("docker"))
    for p in [model, *model.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    ids = {n: load_or_create_identity(tmp_path / n / "node.key") for n in ("trainer", "validator")}
    tport = free_port(gw)
    spec = NetworkSpec(
        network_id="p2prl-docker-test",
        validators=[ids["validator"].public_hex],
        bootstrap=[f"/ip4/{gw}/tcp/{tport}/p2p/{peer_id_for(ids['trainer'])}"],
        max_new_tokens=4,
        group_size=4,
        groups_per_batch=4,
        anchor_interval=3,
        chunk_size=64 * 1024,
    )
    genesis = write_genesis(genesis_from_spec(spec, ids["trainer"], info), tmp_path / "genesis.json")
    genesis.chmod(0o644)
    tmp_path.chmod(0o755)

    sport = {n: free_port() for n in ("trainer", "validator", "miner")}
    common = ["--network", str(genesis), "--model-cache", str(model), "--no-s3-enable", "--heartbeat-s", "1"]
    common += ["--torch-threads", "1", "--local-network"]  # the nodes sit on the docker0 bridge
    sup = Supervisor(tmp_path)
    keys, data, name = f"{PREFIX}-miner-keys", f"{PREFIX}-miner-data", f"{PREFIX}-miner"
    cleanup += [("volume", keys), ("volume", data), ("container", name)]
    try:
        for role, port in (("trainer", tport), ("validator", 0)):
            args = [
                "node",
                "--role",
                role,
                "--data-dir",
                str(tmp_path / role),
                "--key-file",
                str(tmp_path / role / "node.key"),
            ]
            args += ["--listen", f"/ip4/{gw}/tcp/{port}", "--status-port", str(sport[role]), *common]
            if role == "trainer":
                args += ["--min-publish-s", "1"]
            else:
                args += ["--calibrate-tolerances"]
            sup.spawn(role, args)
        run = ["run", "-d", "--name", name, "-v", f"{keys}:/keys", "-v", f"{data}:/data"]
        run += ["-v", f"{genesis}:/genesis.json:ro", "-v", f"{model}:/model:ro"]
        run += ["-p", f"127.0.0.1:{sport['miner']}:8080", "-e", "P2PRL_STATUS_HOST=0.0.0.0"]
        run += [image, "node", "--role", "miner"]
        run += [
            "--network",
            "/genesis.json",
            "--model-cache",
            "/model",
            "--no-s3-enable",
            "--heartbeat-s",
            "1",
        ]
        run += ["--torch-threads", "1", "--local-network"]
        docker(*run)

        def detail() -> str:
            logs = docker("logs", "--tail", "30", name, check=False)
            return "\n".join(
                [f"--- miner\n{logs.stdout}{logs.stderr}"]
                + [f"--- {c.name}\n{c.tail(20)}" for c in sup.children]
            )

        def synced_and_accepted() -> bool:
            for c in sup.children:
                assert c.alive, detail()
            m, t, v = _status(sport["miner"]), _status(sport["trainer"]), _status(sport["validator"])
            if not (m and t and v):
                return False
            return (
                int(t["version"]) >= 1
                and int(m["version"]) >= 1
                and int(m.get("counters", {}).get("groups_accepted", 0)) > 0
                and int(v.get("scores", {}).get(m["key"], 0)) > 0
            )

        _wait(synced_and_accepted, 300, "the miner to sync and have rollouts accepted", detail)
        m = _status(sport["miner"])
        assert m is not None
        t = _status(sport["trainer"])
        assert t is not None
        # in sync: the miner holds the weights the trainer signed for its version
        assert m["weights_hash"] == t["hashes"][str(m["version"])], detail()

        def health() -> str:
            return docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()

        _wait(lambda: health() == "healthy", 150, "the HEALTHCHECK to report healthy", detail)

        before = docker("exec", name, "ls", "/data").stdout.split()
        key_before = m["key"]
        docker("restart", "-t", "30", name, timeout=90)
        _wait(lambda: _status(sport["miner"]) is not None, 120, "the restarted miner's status", detail)
        again = _status(sport["miner"])
        assert again is not None and again["key"] == key_before, "the key volume kept the identity"
        assert set(before) <= set(docker("exec", name, "ls", "/data").stdout.split())
        _wait(
            lambda: int((_status(sport["miner"]) or {}).get("version", 0)) >= int(m["version"]),
            120,
            "the restarted miner to be back at its version",
            detail,
        )
    finally:
        sup.stop_all()
        docker("rm", "-f", name, check=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
