"""Ctrl-C on the demo's dashboard says at once that the network is stopping and ends with the
run's summary (it took 12 s in silence and printed nothing)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/status", timeout=5) as r:
            return bool(json.load(r))
    except (OSError, ValueError):
        return False


def test_ctrl_c_on_the_dashboard_stops_with_a_message_and_a_summary(tmp_path: Path, model_cache: Path) -> None:
    # the dashboard draws as on a terminal (rich: TTY_COMPATIBLE / FORCE_COLOR)
    env = {**os.environ, "P2PRL_CACHE": str(model_cache), "TTY_COMPATIBLE": "1", "FORCE_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2prl", "demo", "--miners", "1", "--dir", str(tmp_path / "demo")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 300
        urls: list[str] = []
        while not urls or not all(_up(u) for u in urls):  # every node up: the dashboard is drawing
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines[-50:])
            nodes = [ln for ln in list(lines) if ln.startswith("nodes: ")]
            urls = re.findall(r"http://127\.0\.0\.1:\d+", nodes[0]) if nodes else []
            time.sleep(1.0)
        time.sleep(3.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("the demo did not stop within 120 s of Ctrl-C:\n" + "".join(lines[-50:])) from None
        took = time.monotonic() - t0
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:  # a demo that hung: it and its nodes (each in a session of its own)
            proc.kill()
            proc.wait()
            subprocess.run(["pkill", "-9", "-f", str(tmp_path / "demo")], check=False)
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    after = text.split("stopping 3 nodes (each saves its state; up to 20 s)…", 1)
    assert len(after) == 2, text[-3000:]
    assert "stopped in " in after[1] and "verdict: " in after[1], after[1][-3000:]
    assert "Traceback" not in text, text[-3000:]
    print(f"Ctrl-C to exit: {took:.1f} s")
