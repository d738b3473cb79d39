"""scripts/bootstrap.sh: `demo` needs only the package (an install with the extras, or without,
serves it; `test` and `shell` need the extras), and ``P2PRL_CPU_CAP`` caps the CPU features torch and
oneDNN use. Run against a stand-in environment whose ``python`` refuses pip, so nothing is installed."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bootstrap.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None
    or not any(Path(p).exists() for p in ("/usr/include/gmp.h", "/usr/include/x86_64-linux-gnu/gmp.h")),
    reason="without gcc and libgmp-dev the script installs them first",
)


def _venv(tmp: Path, installed: str) -> Path:
    """A stand-in environment: ``python`` runs this interpreter but refuses ``-m pip`` (logging it),
    ``p2prl`` prints the CPU cap it was started with; the stamp says what was installed."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m pip" ] && {{ echo "$*" >>"{tmp}/pip.log"; exit 1; }}\nexec {sys.executable} "$@"\n')
    p2prl = venv / "bin" / "p2prl"
    p2prl.write_text(f'#!/bin/sh\necho "p2prl $* ATEN=$ATEN_CPU_CAPABILITY ONEDNN=$ONEDNN_MAX_CPU_ISA" >"{tmp}/ran.log"\n')
    (venv / "bin" / "activate").write_text(f'PATH="{venv}/bin:$PATH"\n')
    for f in (py, p2prl):
        f.chmod(0o755)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes())
    (venv / ".p2prl-installed").write_text(f"{want.hexdigest()} {installed}\n")
    return venv


def _run(tmp: Path, venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "P2PRL_CPU_CAP")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**base, "P2PRL_VENV": str(venv), "CI": "true", **env},
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("installed", ["base", "full"])
def test_demo_runs_on_any_install_and_the_cap_reaches_it(tmp_path: Path, installed: str) -> None:
    venv = _venv(tmp_path, installed)
    res = _run(tmp_path, venv, "demo", "--duration", "5", P2PRL_CPU_CAP="avx2")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ran.log").read_text().strip() == "p2prl demo --duration 5 ATEN=avx2 ONEDNN=AVX2"
    assert not (tmp_path / "pip.log").exists()


def test_shell_on_a_demo_install_installs_the_extras(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "base")
    res = _run(tmp_path, venv, "shell")
    assert res.returncode != 0  # the stand-in refuses pip
    assert "-m pip install" in (tmp_path / "pip.log").read_text()


def test_an_unknown_cap_is_refused(tmp_path: Path) -> None:
    res = _run(tmp_path, _venv(tmp_path, "full"), "demo", P2PRL_CPU_CAP="avx9")
    assert res.returncode == 2 and "avx2 or avx512" in res.stderr
    assert not (tmp_path / "ran.log").exists()
