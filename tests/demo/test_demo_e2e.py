"""End to end, multi-process: `p2prl demo --duration` with one dishonest miner.

Every node is its own process talking libp2p on 127.0.0.1, with a moto S3 endpoint over HTTP. At
the end the miners must hold the trainer's weights bit for bit, the honest miner's rollouts must be
accepted and scored, the dishonest one's rejected and scored zero, and rewards must be recorded.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_with_dishonest_miner(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "summary.json"
    env = {**os.environ, "P2PRL_CACHE": str(model_cache)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2prl",
            "demo",
            "--duration",
            "60",
            "--dishonest-miner",
            "--summary-json",
            str(out),
            "--dir",
            str(tmp_path / "demo"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    logs = tmp_path / "demo" / "logs"
    detail = proc.stdout[-3000:] + proc.stderr[-3000:]
    for f in sorted(logs.glob("*.log")) if logs.exists() else []:
        detail += f"\n--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
    assert proc.returncode == 0, detail
    s = json.loads(out.read_text())
    assert "error" not in s, detail
    assert s["exit_codes"] == {"trainer": 0, "validator": 0, "miner1": 0, "miner2": 0}
    assert s["versions_published"] >= 2, detail
    honest, cheat = s["miners"]
    # all miners (the cheat syncs honestly; it only cheats when generating) end on the trainer's version
    assert s["miners_version"] == s["trainer_version"], detail
    for m in (honest, cheat):
        assert m["version"] == s["trainer_version"]
        assert m["weights_hash"] == s["trainer_weights_hash"] != ""
        assert m["weights_sha256"] == s["trainer_weights_sha256"] != ""
    assert s["rollouts_accepted"] > 0 and s["groups_trained_on"] > 0, detail
    # patches reached every miner, and the trainer's upload is counted against what it published
    assert all(m["bytes_from_peers"] + m["bytes_from_s3"] > 0 for m in s["miners"]), detail
    assert s["trainer_patch_bytes"] > 0 and s["trainer_upload_bytes"] > 0, detail
    assert s["trainer_upload_ratio"] == round(s["trainer_upload_bytes"] / s["trainer_patch_bytes"], 3)
    assert honest["score"] > 0 and honest["groups_accepted"] > 0
    assert cheat["score"] == 0 and cheat["groups_accepted"] == 0 and cheat["groups_rejected"] > 0
    hard = {"fingerprint", "logprob", "distribution", "distribution_batch", "not_checked"}
    assert set(s["rejections"]) & hard, s["rejections"]
    assert s["reward_first"] is not None and s["reward_last"] is not None
    assert len(s["reward_by_version"]) >= 1


def _processes_under(path: Path) -> list[int]:
    """Pids of live processes whose command line names ``path``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (ln for ln in (d / "status").read_text().splitlines() if ln.startswith("State:")), ""
            )
        except OSError:
            continue
        if str(path) in cmd and "Z" not in state.split()[1:2]:
            pids.append(int(d.name))
    return pids


def test_hangup_stops_every_node(tmp_path: Path, model_cache: Path) -> None:
    """Closing the terminal (SIGHUP) stops the demo like Ctrl-C: no node outlives it."""
    import signal
    import time

    root = tmp_path / "demo"
    env = {**os.environ, "P2PRL_CACHE": str(model_cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2prl", "demo", "--headless", "--dir", str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        for line in proc.stdout:  # "nodes: ..." once every node process is spawned
            if line.startswith("nodes:") or time.monotonic() > deadline:
                break
        assert len(_processes_under(root)) >= 4, "the demo's nodes did not start"
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=90)
        deadline = time.monotonic() + 20
        while _processes_under(root) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _processes_under(root) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _processes_under(root):
            os.kill(pid, 9)
