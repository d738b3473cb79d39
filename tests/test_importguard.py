"""Broken builds of optional media packages (what vLLM's CPU extra can pull in) do not break
transformers: they are treated as absent, in this process and in its children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, subprocess, sys
import p2prl
from transformers import Qwen3Config  # its configs import image utilities, which import torchvision
Qwen3Config()
from p2prl.importguard import BLOCKED
child = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torchvision'))"],
                       capture_output=True, text=True).stdout.strip()
import json
print(json.dumps([sorted(BLOCKED), str(importlib.util.find_spec("torchvision")),
                  str(importlib.util.find_spec("torchcodec")), child]))
"""


def _broken(root: Path, name: str, error: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"raise {error}\n")


@pytest.mark.slow
def test_broken_media_builds_are_treated_as_absent(tmp_path: Path) -> None:
    _broken(tmp_path, "torchvision", 'RuntimeError("operator torchvision::nms does not exist")')
    _broken(tmp_path, "torchcodec", 'OSError("Could not load this library: libtorchcodec_image.so")')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    blocked, vision, codec, child = json.loads(out.stdout)
    assert {"torchcodec", "torchvision"} <= set(blocked)  # (a real broken torchaudio may join them)
    assert vision == codec == child == "None", out.stdout


def test_a_media_package_that_loads_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "torchcodec").mkdir()
    (tmp_path / "torchcodec" / "__init__.py").write_text("OK = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    code = (
        "import p2prl, transformers, torchcodec; from p2prl.importguard import BLOCKED; "
        "print(torchcodec.OK, 'torchcodec' in BLOCKED)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False"]
