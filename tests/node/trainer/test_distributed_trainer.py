"""A trainer sharded over 2 ranks under real torchrun (gloo on CPU) in a real network: a validator and a
miner on 127.0.0.1 feed it rollouts, the miner applies its patches bit-exactly, and when a rank dies
the trainer goes down leaving a chain that verifies (no half-published version)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from p2prl.dashboard import fetch_status
from p2prl.net.ports import free_port
from p2prl.node.run import start_node
from p2prl.patch import ChainPublisher, PatchEncoder, materialize, plan_sync
from p2prl.store import BlobStore

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    for p in _children(torchrun_pid):
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return p
    return None


def _status(url: str) -> dict:
    try:
        return fetch_status(url)
    except (OSError, ValueError):
        return {}


def _chain(data: Path, net) -> ChainPublisher:
    """The trainer's chain as a restart reads it: rebuilt from disk, every hash checked."""
    store = BlobStore(data / "blobs", 1 << 40)
    return ChainPublisher(data / "trainer" / "chain", net.ids["trainer"], "test-net", store=store)


def test_sharded_trainer_publishes_resumes_and_dies_cleanly(make_net, wait_for) -> None:
    """Patches a miner applies bit-exactly; a graceful stop; a restart from the distributed
    checkpoint; then a rank dies and the trainer goes down with a chain that verifies."""
    net = make_net(("trainer", "validator", "miner1"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = net.root / "trainer"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "p2prl"]
    cmd += [
        "--log-level",
        "INFO",
        "node",
        "--role",
        "trainer",
        "--network",
        str(net.genesis),
        "--data-dir",
        str(data),
    ]
    cmd += ["--listen", f"/ip4/127.0.0.1/tcp/{net.trainer_port}", "--model-cache", str(net.model_cache)]
    cmd += ["--no-s3-enable", "--status-port", str(port), "--heartbeat-s", "1", "--torch-threads", "1"]
    cmd += ["--train-batch-groups", "2", "--checkpoint-every", "1", "--min-publish-s", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = (net.root / "trainer.log").open("ab")

    def launch() -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)

    version = lambda: int(_status(url).get("version", -1))  # noqa: E731
    proc = launch()
    v = m = None
    try:
        wait_for(lambda: version() == 0, 120, "version 0 from the sharded trainer")
        v = start_node(net.config("validator", calibrate_tolerances=True))
        m = start_node(net.config("miner1"))
        wait_for(lambda: version() >= 2, 150, "two trained versions")

        def miner_matches() -> bool:
            hashes = _status(url).get("hashes", {})
            w = m.role.active
            return w.version >= 2 and hashes.get(str(w.version)) == w.hash

        wait_for(miner_matches, 90, "the miner on a trained version, bit-exact")
        assert m.rt.status.counter("patches_applied") >= 1
        # a graceful stop: rank 0 finishes what it started (the followers wait for it)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
        assert not _children(proc.pid)
        assert b"[rank0]" not in (net.root / "trainer.log").read_bytes()  # no rank failed
        head = _chain(data, net).version
        meta = json.loads((data / "trainer" / "checkpoint.dcp" / "p2prl_checkpoint.json").read_text())
        assert meta["world_size"] == 2 and meta["version"] >= head  # optimizer steps, not versions
        # a restart resumes the version and the sharded masters from the checkpoint, and trains on
        proc = launch()
        resumed = lambda: _status(url).get("counters", {}).get("restarts_resumed") == 1  # noqa: E731
        wait_for(resumed, 120, "the restarted trainer")
        assert version() >= head  # the version never goes backwards
        assert b"restored master weights and optimizer from" in (net.root / "trainer.log").read_bytes()
        wait_for(lambda: version() > head, 120, "a version after the restart")
        # a rank dies: torchrun stops the trainer, whatever it was doing
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=90)
        assert proc.returncode != 0
        assert not _children(proc.pid)
    finally:
        for node in (m, v):
            if node is not None:
                node.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    # the chain on disk verifies end to end (reopening rebuilds and checks every hash) ...
    chain = _chain(data, net)
    assert chain.version is not None and chain.version > head
    # ... and each patch is byte-identical to the one a single process writes for the same weights
    last = chain.manifests.get(chain.version, "delta")
    prev = materialize(None, plan_sync(None, None, chain.manifests, chain.version - 1), chain.store.get)
    assert chain.state is not None
    enc = PatchEncoder(prev, chain.state, zstd_level=chain.zstd_level, base_hash=last.base_hash)
    assert b"".join(enc.segments()) == chain.store.get(last.blob.id)
