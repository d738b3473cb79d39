"""The transformers engine as another CPU generation runs it: the founder's reference run on a newer
CPU mines with an older one's kernels too, so the tolerances it pins hold between the two.

torch and oneDNN choose their kernels by CPU once per process (AVX2, AVX-512, AMX), and honest
numerics differ between them by a rounding step here and there: a miner on an AVX2 machine judged by
a validator on an AVX-512 one drifts by more than either does against itself. A newer CPU runs the
older kernels when told before torch starts (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), so
the engine lives in a child process (``python -m p2prl.node.weights.isa``, started with them) and
answers ``generate`` over a private socket.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# the kernels of each older CPU generation, as a newer CPU is made to run them
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class _Ids:
    """What generation needs of the tokenizer (the child gets these, not the tokenizer)."""

    pad_id: int
    stop_ids: frozenset[int]


def _send(conn: Connection, obj: Any) -> None:
    """Plain pickles (tensors inline): the multiprocessing pickler would hand tensors over through
    shared memory, which needs a parent that multiprocessing started."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())  # our own child, over a private socket


def _serve(conn: Connection) -> None:
    """The child: load the model written to the directory it is sent with this process's kernels,
    then answer generate calls until told to stop."""
    import torch

    from p2prl.patch import weights_hash
    from p2prl.rl import HFEngine, load_weights_model

    path, ids = _recv(conn)
    try:
        model = load_weights_model(Path(path), torch.bfloat16)
        h = weights_hash(model.state_dict())
        _send(conn, ("ready", h, torch.backends.cpu.get_cpu_capability()))
    except Exception as e:  # told to the parent, which raises it
        _send(conn, ("error", f"{type(e).__name__}: {e}", ""))
        return
    while True:
        msg = _recv(conn)
        if msg is None:
            return
        max_batch, prompts, n, params, keys = msg
        try:
            out = HFEngine(model, ids, max_batch=max_batch).generate(prompts, n, params, keys)
            _send(conn, ("ok", out))
        except Exception as e:
            _send(conn, ("error", f"{type(e).__name__}: {e}"))


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
        want = weights_hash(model.state_dict())
        mine, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env={**os.environ, **ISA_ENV[isa]},
        )
        theirs.close()
        self._conn = Connection(mine.detach())
        try:
            _send(self._conn, (self._dir.name, _Ids(int(tokenizer.pad_id), frozenset(map(int, tokenizer.stop_ids)))))
            if not self._conn.poll(START_TIMEOUT_S):
                raise RuntimeError(f"the {isa} engine did not start in {START_TIMEOUT_S:.0f} s")
            status, detail, capability = _recv(self._conn)
            if status != "ready":
                raise RuntimeError(f"the {isa} engine failed to load the model: {detail}")
            if detail != want:
                raise RuntimeError(f"the {isa} engine loaded other weights ({detail[:12]}…)")
        except (OSError, EOFError, RuntimeError) as e:
            self.close()
            if isinstance(e, RuntimeError):
                raise
            raise RuntimeError(f"the {isa} engine exited while starting: {e!r}") from e
        self.capability: str = capability

    def sized(self, max_batch: int) -> IsaEngine:
        """This engine generating ``max_batch`` rows per forward (calibration's batch sizes)."""
        self.max_batch = max_batch
        return self

    def generate(self, prompts: list[list[int]], n_samples: int, params: Any, keys: Any = None) -> Any:
        _send(self._conn, (self.max_batch, prompts, n_samples, params, keys))
        status, out = _recv(self._conn)
        if status != "ok":
            raise RuntimeError(f"the engine's child failed: {out}")
        return out

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self.running:
            try:
                _send(self._conn, None)
            except OSError:
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._dir.cleanup()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
