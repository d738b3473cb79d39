"""A file or port the user named that cannot be used is one line on stderr, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "P2PRL_LOG_LEVEL": "WARNING"}
    return subprocess.run([sys.executable, "-m", "p2prl", *args], capture_output=True, text=True, env=env)


def test_unwritable_key_path_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # a directory that cannot be made, for any user
    r = run("keys", "generate", "--out", str(tmp_path / "file" / "sub" / "node.key"))
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
