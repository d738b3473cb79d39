"""The built-in model's weights are the same bits on every CPU: they ship, and a build writes them.

Training them (``train_default_model``) gives other bits on an AVX2, an AVX-512 and an AMX CPU; a
genesis names them by hash, so the package carries the weights and every node writes the same file.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from p2prl.patch import weights_hash_file
from p2prl.rl.model import (
    DEFAULT_MODEL_NAME,
    DEFAULT_WEIGHTS_FILE,
    DEFAULT_WEIGHTS_HASH,
    build_default_model,
    model_meta,
)


def test_the_shipped_file_is_the_hash_the_code_names() -> None:
    assert weights_hash_file(DEFAULT_WEIGHTS_FILE) == DEFAULT_WEIGHTS_HASH


def test_a_build_capped_to_avx2_writes_the_same_weights(tmp_path: Path) -> None:
    """The CPU features torch and oneDNN may use, capped as on an AVX2-only machine: same hash."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = "import sys; from pathlib import Path; from p2prl.rl.model import build_default_model; "
    code += "print(build_default_model(Path(sys.argv[1])))"
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = Path(res.stdout.strip())
    assert weights_hash_file(out / "model.safetensors") == DEFAULT_WEIGHTS_HASH
    assert model_meta(out)["weights_hash"] == DEFAULT_WEIGHTS_HASH


def test_a_cache_of_other_weights_is_replaced(tmp_path: Path) -> None:
    """A directory this package trained on the machine before the weights shipped (another hash on
    another CPU) is not reused under the same name."""
    stale = tmp_path / DEFAULT_MODEL_NAME
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"other weights")
    (stale / "p2prl_model.json").write_text(json.dumps({"weights_hash": "96de4c1a" + "0" * 56}))
    out = build_default_model(tmp_path)
    assert out == stale and model_meta(out)["weights_hash"] == DEFAULT_WEIGHTS_HASH
    assert weights_hash_file(out / "model.safetensors") == DEFAULT_WEIGHTS_HASH
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEFAULT_MODEL_NAME]  # nothing left behind
