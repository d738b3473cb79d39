"""`p2prl bench scale` at the tiny scale: real trainer, validator and miner processes, per-version figures."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_scale_tiny_reports_every_version() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2prl",
            "bench",
            "scale",
            "--scale",
            "tiny",
            "--versions",
            "2",
            "--lr",
            "3e-4",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert [v["version"] for v in r["versions"]] == [1, 2]
    for v in r["versions"]:
        for k in ("grpo_step_ms", "patch_encode_ms", "miner_transfer_ms", "miner_apply_verify_ms"):
            assert v[k] is not None and v[k] >= 0, (k, v)
        assert v["validation_ms"] > 0 and v["patch_bytes"] > 0 and v["changed"] > 0
        assert 0 < v["bits_per_changed"] < 64
    assert set(r["peak_rss_mib"]) == {"trainer", "validator", "miner"}
    assert all(mib > 100 for mib in r["peak_rss_mib"].values())
    assert r["parameters"] > 0 and r["kv_cache_mib"] > 0
