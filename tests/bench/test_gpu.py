"""``scripts/gpu-check.sh`` (``p2prl.bench.gpu``): one line and exit 3 without a CUDA device, the whole
table with ``--device cpu``, and what it needs named when it is missing. CUDA itself is not tested here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2prl.bench import gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable, **env},
        cwd=ROOT.parent,  # from anywhere: the script finds its checkout
    )


def test_without_cuda_one_line_and_exit_3() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the full check is what runs here")
    proc = _run()
    assert proc.returncode == gpu.EXIT_NO_CUDA, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("no CUDA device: torch ") and "is_available() is False" in first
    assert "--device cpu" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_missing_packages_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(gpu.NEEDED, "p2prl_no_such_module", "p2prl-no-such-package")
    assert gpu.main(["--device", "cpu", "--quick"]) == gpu.EXIT_MISSING
    out = capsys.readouterr().out
    assert "missing Python packages: p2prl-no-such-package" in out and "--wheels DIR" in out


def test_table_marks_failures() -> None:
    rows = [
        gpu.Row("honest miner (tiny)", "miner cuda, validator cpu", True, "512/512 accepted", 12.3, {}),
        gpu.Row("version switch (hf)", "cuda", False, "error: RuntimeError: x", 1.0, {}),
    ]
    lines = gpu.table(rows).splitlines()
    assert lines[0].split() == ["check", "where", "ok", "seconds", "result"]
    assert "  ok  " in lines[1] and lines[1].endswith("512/512 accepted")
    assert "FAIL" in lines[2]
    # the columns line up
    assert lines[1].index("ok") == lines[2].index("FAIL") == lines[0].index("ok")


@pytest.mark.slow
def test_cpu_quick_run_prints_the_table(model_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(
        "--device", "cpu", "--quick", "--quiet", "--cache", str(model_cache), "--out", str(out), timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert text.startswith("no CUDA device") or text.startswith("CUDA device")
    table = text[text.index("check ") :].splitlines()
    checks = {line.split("  ")[0] for line in table[1:] if line and not line.startswith("gpu-check")}
    assert checks == {
        "honest miner (tiny)",
        "verify vs generate (0.5B shape)",
        "version switch (hf)",
        "version switch (hf, 0.5B shape)",
    }, text
    assert all("  ok  " in line for line in table[1:5]), text
    assert text.rstrip().endswith("gpu-check: all checks passed")
    records = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(records) == {"honest_same_device", "verify_cost", "switch_hf", "switch_hf_05b"}
    honest = records["honest_same_device"]["record"]
    assert honest["rollouts"] > 0 and honest["false_rejects"] == 0
    assert records["switch_hf"]["record"]["engine_hash_ok_every_version"] is True
    big = records["switch_hf_05b"]["record"]["0.013"]
    assert big["engine_hash_ok_every_version"] is True and big["separate_copy"] is True
    assert 0 < big["written_fraction"] < 0.05  # the changed elements only, not the model
    v = records["verify_cost"]["record"]
    assert v["verify_default_accepted"] == v["verify_all_accepted"] == v["rollouts"] > 0
