"""The transformers engine as another CPU generation runs it: the founder's reference run on a newer
CPU mines with an older one's kernels too, so the tolerances it pins hold between the two.

torch and oneDNN choose their kernels by CPU once per process (AVX2, AVX-512, AMX), and honest
numerics differ between them by a rounding step here and there: a miner on an AVX2 machine judged by
a validator on an AVX-512 one drifts by more than either does against itself. A newer CPU runs the
older kernels when told before torch starts (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), so
the engine lives in a child process started with them and answers ``generate`` over a pipe.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# the kernels of each older CPU generation, as a newer CPU is made to run them
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
START_TIMEOUT_S = 600.0

_env_lock = threading.Lock()


@contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``extra`` while a child process starts (it copies the environment then)."""
    with _env_lock:
        old = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@dataclass(frozen=True)
class _Ids:
    """What generation needs of the tokenizer (the child gets these, not the tokenizer)."""

    pad_id: int
    stop_ids: frozenset[int]


def _serve(conn: Connection, path: str, ids: _Ids) -> None:
    """The child: load the model written to ``path`` with this process's kernels, then answer
    generate calls."""
    import torch

    from p2prl.patch import weights_hash
    from p2prl.rl import HFEngine, load_weights_model

    try:
        model = load_weights_model(Path(path), torch.bfloat16)
        h = weights_hash({k: v for k, v in model.state_dict().items()})
        conn.send(("ready", h, torch.backends.cpu.get_cpu_capability()))
    except Exception as e:  # told to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}", ""))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        max_batch, prompts, n, params, keys = msg
        try:
            out = HFEngine(model, ids, max_batch=max_batch).generate(prompts, n, params, keys)
            conn.send(("ok", out))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


class IsaEngine:
    """``HFEngine.generate`` on ``model``'s weights in a child process running ``isa``'s kernels (the
    weights travel through a temporary model directory; the child's weights hash must be the
    parent's). ``capability`` is the kernel set the child's torch reports (``AVX2``). ``close``
    ends it."""

    def __init__(self, isa: str, model: Any, tokenizer: Any) -> None:
        if isa not in ISA_ENV:
            raise ValueError(f"unknown CPU generation {isa!r}: one of {', '.join(ISA_ENV)}")
        from p2prl.patch import weights_hash

        self.tokenizer = tokenizer
        self.max_batch = 512
        self._dir = tempfile.TemporaryDirectory(prefix=f"p2prl-{isa}-")
        model.save_pretrained(self._dir.name)
        want = weights_hash({k: v for k, v in model.state_dict().items()})
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        ids = _Ids(int(tokenizer.pad_id), frozenset(int(i) for i in tokenizer.stop_ids))
        self._proc = ctx.Process(target=_serve, args=(child, self._dir.name, ids), daemon=True)
        with _environ(ISA_ENV[isa]):
            self._proc.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the {isa} engine did not start in {START_TIMEOUT_S:.0f} s")
        status, detail, capability = self._conn.recv()
        if status != "ready":
            self.close()
            raise RuntimeError(f"the {isa} engine failed to load the model: {detail}")
        if detail != want:
            self.close()
            raise RuntimeError(f"the {isa} engine loaded other weights ({detail[:12]}…)")
        self.capability: str = capability

    def sized(self, max_batch: int) -> IsaEngine:
        """This engine generating ``max_batch`` rows per forward (calibration's batch sizes)."""
        self.max_batch = max_batch
        return self

    def generate(self, prompts: list[list[int]], n_samples: int, params: Any, keys: Any = None) -> Any:
        self._conn.send((self.max_batch, prompts, n_samples, params, keys))
        status, out = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"the engine's child failed: {out}")
        return out

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._dir.cleanup()
