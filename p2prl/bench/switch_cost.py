"""A version switch's costs on one model, for comparing two source trees under one load.

Run by path with the tree to measure first on ``PYTHONPATH`` (it uses only what both the old and the
new tree have; a tree with ``LiveWeights.prepare`` is measured as check, then swap)::

    PYTHONPATH=<tree> python p2prl/bench/switch_cost.py MODEL_DIR DENSITY VERSIONS [busy] [hash-first]

Per version: the trainer's ``ChainPublisher.publish`` of the weights with ``DENSITY`` of the bf16
elements moved by 1–3 ulps, then the node's ``LiveWeights`` switch to it: as a miner switches (a tree
with ``LiveWeights.confirm``: the patch decoded, the swap, then the result hashed: ``confirm_s``), or
``hash-first`` (a validator's switch: checked and hashed, then the swap). ``busy``: a thread runs
Python without pause the whole time, as a generation loop driving a GPU nearly does (the check and
the publish then compete with it for the GIL). Prints one JSON list.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def main(
    model_dir: str, density: float, versions: int, busy: bool = False, hash_first: bool = False
) -> list[dict[str, Any]]:
    import numpy as np
    from safetensors.torch import load_file

    from p2prl.patch import uint_view

    state = load_file(str(Path(model_dir) / "model.safetensors"))
    rng = np.random.default_rng(0)

    def step(s: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, t in s.items():
            n = t.clone()
            v = uint_view(n)
            idx = np.flatnonzero(rng.random(v.size, dtype=np.float32) < density)
            v[idx] += rng.integers(1, 4, idx.size, dtype=v.dtype)
            out[k] = n
        return out

    work = tempfile.mkdtemp(prefix="p2prl-switch-cost-")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    try:
        return _measure(work, state, step, density, versions, hash_first)
    finally:
        stop.set()
        shutil.rmtree(work, ignore_errors=True)


def _measure(
    work: str, state: dict[str, Any], step: Any, density: float, versions: int, hash_first: bool
) -> list[dict[str, Any]]:
    from p2prl.crypto import Identity
    from p2prl.patch import ChainPublisher, ManifestStore, plan_sync
    from p2prl.store import BlobStore

    try:
        from p2prl.node.weights.live import LiveWeights
        from p2prl.node.weights.version import Weights
    except ImportError:  # a tree from before p2prl.node's subpackages
        from p2prl.node.live import LiveWeights  # type: ignore[no-redef]
        from p2prl.node.weights import Weights  # type: ignore[no-redef]

    pub = ChainPublisher(Path(work) / "t", Identity.generate(), "switch-cost", anchor_interval=10**6)
    store, index = BlobStore(Path(work) / "n"), ManifestStore("switch-cost", pub.identity.public_key)

    def publish(s: dict[str, Any]) -> Any:
        pv = pub.publish(s)
        for p in pv.items:
            index.add(p.envelope)
            store.put(p.blob, expected_id=p.manifest.blob.id)
        return pv

    publish(state)
    live_state = {k: v.clone() for k, v in state.items()}
    live = LiveWeights(live_state, Weights(0, pub.result_hash, live_state))
    # a tree whose miners switch before the hash: decode, swap, then confirm (hashed after)
    deferred = hasattr(live, "confirm") and not hash_first
    cur, rows = state, []
    for v in range(1, versions + 1):
        cur = step(cur)
        t0 = time.perf_counter()
        pv = publish(cur)
        t1 = time.perf_counter()
        plan = plan_sync(v - 1, live.hash, index, v)
        t2 = time.perf_counter()
        prepared = None
        if deferred:
            prepared = live.prepare(plan, store.get, deferred=True)
        elif hasattr(live, "prepare"):
            prepared = live.prepare(plan, store.get)
        t3 = time.perf_counter()
        if prepared is not None:
            live.advance(plan, store.get, prepared)
        else:
            live.advance(plan, store.get)
        t4 = time.perf_counter()
        ok = live.confirm() if deferred else True
        t5 = time.perf_counter()
        assert ok and live.hash == pv.result_hash
        rows.append(
            {
                "publish_s": round(t1 - t0, 3),
                "check_s": round(t3 - t2, 3),
                "swap_s": round(t4 - t3, 3),
                "switch_s": round(t4 - t2, 3),
                "confirm_s": round(t5 - t4, 3),
                "verified_s": round(t5 - t2, 3),
                "blob_MB": round(pv.manifest.blob.size / 1e6, 2),
            }
        )
    return rows


if __name__ == "__main__":
    flags = sys.argv[4:]
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), "busy" in flags, "hash-first" in flags)))
