"""The GPU image (``p2prl:gpu``), started where there is no GPU: it must start, say so, and fall back.

Building it takes long (vLLM and its CUDA torch, several GB: ``bash docker/build.sh gpu``), so this
module does not build it: it runs where a Docker Engine answers and the image is there (skipped with
the reason otherwise). CUDA stays hidden (no ``--gpus``): the CLI starts, the CUDA build of torch and
vLLM import, a node asked for ``--device cuda`` exits with one line saying why, and a miner on
``--device auto`` falls back to the CPU and serves its health endpoint. Whether CUDA itself works
inside it is what ``scripts/gpu-check.sh`` checks on a GPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

IMAGE = os.environ.get("P2PRL_TEST_GPU_IMAGE", "p2prl:gpu")
PREFIX = f"p2prl-gtest-{uuid.uuid4().hex[:8]}"
DOCKER = shutil.which("/usr/bin/docker") or shutil.which("docker") or ""

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def docker(*args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def image() -> str:
    if not DOCKER:
        pytest.skip("no docker client")
    if subprocess.run([DOCKER, "version"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no Docker Engine answers (bash scripts/bootstrap.sh test starts one as root)")
    if subprocess.run([DOCKER, "image", "inspect", IMAGE], capture_output=True, timeout=30).returncode != 0:
        pytest.skip(f"{IMAGE} is not built (bash docker/build.sh gpu: vLLM's CUDA build, several GB)")
    return IMAGE


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genesis and its base model, readable by the image's user: what a miner is started with."""
    from p2prl.crypto.keys import load_or_create_identity
    from p2prl.node.setup.genesis import write_genesis
    from p2prl.node.setup.netinit import NetworkSpec, base_model_info, genesis_from_spec
    from p2prl.rl.local import default_cache_dir

    d = tmp_path_factory.mktemp("gpu-image")
    model = d / "model"
    info = base_model_info(default_cache_dir())
    shutil.copytree(
        default_cache_dir(), model, ignore=shutil.ignore_patterns("docker", "engine-update-*", ".*")
    )
    for p in [d, model, *model.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    trainer, validator = (load_or_create_identity(d / f"{n}.key") for n in ("trainer", "validator"))
    spec = NetworkSpec(network_id="p2prl-gpu-image-test", validators=[validator.public_hex])
    write_genesis(genesis_from_spec(spec, trainer, info), d / "genesis.json").chmod(0o644)
    return d


@pytest.fixture(scope="module")
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for n in names:
        docker("rm", "-f", "-v", n, check=False)


def test_cli_starts_without_a_gpu(image: str) -> None:
    assert "Usage" in docker("run", "--rm", image, "--help").stdout
    node_help = docker("run", "--rm", image, "node", "--help").stdout
    assert "--device" in node_help and "--engine" in node_help
    assert docker("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip() == "10001"


def test_cuda_torch_and_vllm_import_with_cuda_hidden(image: str) -> None:
    probe = (
        "import json, torch, vllm, transformers; print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'available': torch.cuda.is_available(), 'vllm': vllm.__version__, "
        "'transformers': transformers.__version__}))"
    )
    out = docker("run", "--rm", "--entrypoint", "python", image, "-c", probe, timeout=300).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["cuda"] and got["available"] is False, got
    assert got["vllm"] == "0.32.0" and got["torch"].startswith("2.13.0"), got


def test_node_asked_for_cuda_exits_with_the_reason(image: str, network: Path) -> None:
    proc = docker(
        "run",
        "--rm",
        "-v",
        f"{network}:/net:ro",
        image,
        "node",
        "--role",
        "miner",
        "--device",
        "cuda",
        "--network",
        "/net/genesis.json",
        "--model-cache",
        "/net/model",
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "torch sees no CUDA device" in out, out
    assert "Traceback" not in out, out


def test_miner_on_auto_falls_back_to_the_cpu_and_is_healthy(
    image: str, network: Path, cleanup: list[str]
) -> None:
    name = f"{PREFIX}-miner"
    cleanup.append(name)
    docker(
        "run",
        "-d",
        "--name",
        name,
        "-v",
        f"{network}:/net:ro",
        image,
        "node",
        "--role",
        "miner",
        "--device",
        "auto",
        "--network",
        "/net/genesis.json",
        "--model-cache",
        "/net/model",
        "--no-s3-enable",
    )
    probe = "import urllib.request, json; print(urllib.request.urlopen('http://127.0.0.1:8080/status', timeout=4).read().decode())"
    deadline, last = time.monotonic() + 300, ""
    while time.monotonic() < deadline:
        state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", (
            docker("logs", name, check=False).stdout[-3000:]
            + docker("logs", name, check=False).stderr[-3000:]
        )
        r = docker("exec", name, "python", "-c", probe, check=False)
        if r.returncode == 0:
            last = r.stdout
            break
        time.sleep(2)
    assert last, (
        "the miner's status endpoint never answered\n" + docker("logs", name, check=False).stderr[-3000:]
    )
    logs = docker("logs", name).stdout + docker("logs", name).stderr
    assert "Traceback" not in logs, logs[-3000:]
