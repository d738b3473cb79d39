"""Ctrl-C on the demo's dashboard says at once that the network is stopping and ends with the
run's summary (it took 12 s in silence and printed nothing)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_ctrl_c_on_the_dashboard_stops_with_a_message_and_a_summary(tmp_path: Path, model_cache: Path) -> None:
    env = {**os.environ, "P2PRL_CACHE": str(model_cache), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2prl", "demo", "--miners", "1", "--dir", str(tmp_path / "demo")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # the dashboard's first frame comes once every node is up
            lines.append(line)
            if "trainer" in line and "127.0.0.1" in line and not line.startswith("nodes:"):
                break
            assert time.monotonic() < deadline, "".join(lines[-50:])
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert proc.returncode == 0, text[-3000:]
    after = text.split("stopping 3 nodes (each saves its state; up to 20 s)…", 1)
    assert len(after) == 2, text[-3000:]
    assert "stopped in " in after[1] and "verdict: " in after[1], after[1][-3000:]
    assert "Traceback" not in text, text[-3000:]
