"""The demo from an install without the S3 server package: it runs peer to peer and says so.

moto (the embedded S3) is a runtime dependency, but a trimmed install may lack it; the demo must
then still run, print a notice, and print a progress line every few seconds while headless.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from p2prl.demo import progress_line

PROGRESS = re.compile(r"^\[ *\d+ s\] trainer v\d+ \(\d+ published\) \| miners v[\d,?]+, \d+/\d+ in sync(, \d+ one version behind)? \|")


def test_progress_line_reports_versions_sync_and_reward() -> None:
    statuses = {
        "trainer": {
            "role": "trainer",
            "version": 7,
            "counters": {"versions_published": 8},
            "reward_by_version": {
                "5": {"mean": 0.2, "count": 10},
                "6": {"mean": 0.4, "count": 10},
                "7": {"mean": 0.6, "count": 20},
            },
        },
        "validator": {"counters": {"groups_accepted": 40, "groups_rejected": 3}},
        "miner1": {"version": 7},
        "miner2": None,
    }
    line = progress_line(12.4, statuses, ["trainer", "validator", "miner1", "miner2"])
    assert PROGRESS.match(line), line
    assert "trainer v7 (8 published)" in line
    assert "miners v7,?, 1/2 in sync" in line
    assert "accepted 40 rejected 3" in line
    assert "reward 0.450 (v7)" in line  # rollout-weighted over the last three versions
    statuses["miner2"] = {"version": 6}
    line = progress_line(12.4, statuses, ["trainer", "validator", "miner1", "miner2"])
    assert "miners v7,6, 1/2 in sync, 1 one version behind |" in line and PROGRESS.match(line), line
    empty = progress_line(0.0, {"trainer": None}, ["trainer", "miner1"])
    assert "reward -" in empty and "0/1 in sync" in empty


@pytest.mark.slow
def test_demo_runs_without_moto(tmp_path: Path, model_cache: Path) -> None:
    hide = tmp_path / "hide" / "moto"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'moto\'", name="moto")\n')
    path = os.pathsep.join([str(hide.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "P2PRL_CACHE": str(model_cache), "PYTHONPATH": path}
    probe = subprocess.run([sys.executable, "-c", "import moto"], env=env, capture_output=True)
    assert probe.returncode != 0, "moto is still importable"
    out = tmp_path / "summary.json"
    args = ["demo", "--duration", "20", "--miners", "1", "--summary-json", str(out), "--dir", str(tmp_path / "demo")]
    proc = subprocess.run(
        [sys.executable, "-m", "p2prl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    detail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, detail
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("notice: the local S3 endpoint cannot start (moto is not installed)"), detail
    assert len([ln for ln in lines if PROGRESS.match(ln)]) >= 3, detail
    s = json.loads(out.read_text())
    assert "error" not in s and s["exit_codes"] == {"trainer": 0, "validator": 0, "miner1": 0}, detail
    assert s["versions_published"] >= 1 and s["rollouts_accepted"] > 0, detail
    (miner,) = s["miners"]
    assert miner["bytes_from_s3"] == 0 and miner["version"] == s["trainer_version"], detail
    genesis = json.loads((tmp_path / "demo" / "genesis.json").read_text())
    assert not json.dumps(genesis).count('"endpoint"'), "the genesis names no S3 location"
