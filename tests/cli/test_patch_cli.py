import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.patch.dtypes import RawTensor
from p2prl.patch.files import load_state_file, save_state_file
from p2prl.patch.hashing import weights_hash

runner = CliRunner()


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": (0.02 * torch.randn(64, 32, generator=g)).bfloat16(),
        "layer.bias": torch.randn(32, generator=g),
    }


@pytest.fixture()
def files(tmp_path):
    base = _state(0)
    new = {k: v.clone() for k, v in base.items()}
    new["layer.weight"].view(torch.int16)[::7, ::3] += 1
    new["layer.bias"][5] = 3.0
    save_state_file(base, tmp_path / "base.safetensors")
    save_state_file(new, tmp_path / "new.safetensors")
    return tmp_path, new


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _no_output(tmp_path, name):
    return not (tmp_path / name).exists() and not list(tmp_path.glob(f".{name}.*"))


def test_diff_apply_inspect(files):
    d, new = files
    r = _run("patch", "diff", d / "base.safetensors", d / "new.safetensors", "-o", d / "p.patch")
    assert r.exit_code == 0, r.output
    assert "bits per changed element" in r.output and "changed" in r.output
    r = _run("patch", "apply", d / "base.safetensors", d / "p.patch", "-o", d / "out.safetensors")
    assert r.exit_code == 0, r.output
    assert weights_hash(load_state_file(d / "out.safetensors")) == weights_hash(new)
    r = _run("patch", "inspect", d / "p.patch", "--json")
    assert r.exit_code == 0
    info = json.loads(r.stdout)
    per = {t["name"]: t["changed"] for t in info["tensors"]}
    assert per == {"layer.bias": 1, "layer.weight": 10 * 11}
    assert info["result_hash"] == weights_hash(new)
    r = _run("patch", "inspect", d / "p.patch")
    assert r.exit_code == 0 and "layer.weight" in r.output


def test_apply_failures_write_nothing(files):
    d, _ = files
    assert (
        _run("patch", "diff", d / "base.safetensors", d / "new.safetensors", "-o", d / "p.patch").exit_code
        == 0
    )
    patch = (d / "p.patch").read_bytes()
    (d / "trunc.patch").write_bytes(patch[:-10])
    bad = bytearray(patch)
    bad[len(bad) // 2] ^= 0x10
    (d / "bad.patch").write_bytes(bytes(bad))
    (d / "junk.safetensors").write_bytes(b"not a model")
    cases = [
        (d / "new.safetensors", d / "p.patch", "wrong base"),
        (d / "base.safetensors", d / "trunc.patch", "truncated"),
        (d / "base.safetensors", d / "bad.patch", ""),
        (d / "junk.safetensors", d / "p.patch", "safetensors"),
        (d / "base.safetensors", d / "missing.patch", "cannot read"),
    ]
    for base, patch_path, reason in cases:
        r = _run("patch", "apply", base, patch_path, "-o", d / "out.safetensors")
        assert r.exit_code == 1, (patch_path, r.output)
        err = r.stderr.strip()
        assert err.startswith("error: ") and reason in err and "\n" not in err
        assert _no_output(d, "out.safetensors")


def test_diff_and_inspect_failures(files):
    d, _ = files
    other = {"x": torch.zeros(3)}
    save_state_file(other, d / "other.safetensors")
    r = _run("patch", "diff", d / "base.safetensors", d / "other.safetensors", "-o", d / "p.patch")
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and _no_output(d, "p.patch")
    (d / "junk.patch").write_bytes(b"P2PT" + b"\xff" * 30)
    for args in (
        ("inspect", d / "junk.patch"),
        ("inspect", d / "junk.patch", "--json"),
        ("inspect", d / "nope"),
    ):
        r = _run("patch", *args)
        assert r.exit_code == 1 and r.stderr.startswith("error: ")


def test_saved_files_are_standard_safetensors(files):
    from safetensors.torch import load_file

    d, new = files
    back = load_file(str(d / "new.safetensors"))
    assert back.keys() == new.keys()
    for k, v in new.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k].view(torch.uint8), v.view(torch.uint8))


@pytest.mark.parametrize("level", [23, -8, 100])
def test_diff_refuses_levels_apply_would_refuse(files, level):
    d, _ = files
    r = _run("patch", "diff", d / "base.safetensors", d / "new.safetensors", "-o", d / "p.patch", "--zstd-level", level)
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "zstd_level" in r.stderr, r.output
    assert _no_output(d, "p.patch")


def _raw(shape, fill):
    return RawTensor("BF16", shape, np.full(int(np.prod(shape)), fill, dtype=np.uint16))


@pytest.mark.parametrize(
    ("name", "shape", "reason"),
    [("", (2,), "name"), ("n" * 1025, (2,), "name"), ("deep", (1,) * 9 + (2,), "shape")],
)
def test_diff_refuses_tensors_apply_would_refuse(tmp_path, name, shape, reason):
    """Every patch `diff` writes is one `apply` accepts: bad names and shapes fail at diff time."""
    save_state_file({name: _raw(shape, 1)}, tmp_path / "a.safetensors")
    save_state_file({name: _raw(shape, 2)}, tmp_path / "b.safetensors")
    r = _run("patch", "diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "-o", tmp_path / "p.patch")
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and reason in r.stderr, r.output
    assert "Traceback" not in r.output and _no_output(tmp_path, "p.patch")


@pytest.mark.slow
def test_patch_commands_do_not_import_torch(files):
    """The file commands run on numpy bit views: torch's import (≈2 s) is not paid."""
    d, _ = files
    code = (
        "import sys\n"
        "from p2prl.cli.main import main\n"
        "sys.argv = ['p2prl'] + sys.argv[1:]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    runs = [
        ("diff", d / "base.safetensors", d / "new.safetensors", "-o", d / "p.patch"),
        ("apply", d / "base.safetensors", d / "p.patch", "-o", d / "o.safetensors"),
        ("inspect", d / "p.patch", "--json"),
    ]
    for args in runs:
        r = subprocess.run([sys.executable, "-c", code, "patch", *map(str, args)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_bench_patch_small(tmp_path):
    r = _run("bench", "patch", "--scale", "0.01", "--repeat", "1", "--warmup", "1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["p2prl"]["bytes"] < out["pulse_ref"]["bytes"]
    assert 0 < out["changed_fraction"] < 0.2
