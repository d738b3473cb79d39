import struct

import blake3
import torch
from patch_testutil import random_state

from p2prl.patch.errors import PatchError
from p2prl.patch.files import save_state_file
from p2prl.patch.hashing import weights_hash, weights_hash_file


def spec_hash(state):
    """The weights hash written straight from docs/PROTOCOL.md §3, independently of the module."""
    h = blake3.blake3(b"p2prl/weights/v1\x00" + struct.pack("<I", len(state)))
    names = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16", "torch.int64": "I64"}
    for name in sorted(state, key=lambda s: s.encode()):
        t = state[name]
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        dt = names[str(t.dtype)].encode()
        nb = name.encode()
        h.update(struct.pack("<I", len(nb)) + nb + bytes([len(dt)]) + dt + bytes([t.dim()]))
        h.update(b"".join(struct.pack("<Q", d) for d in t.shape) + struct.pack("<Q", len(raw)) + raw)
    return h.hexdigest()


def test_matches_the_written_spec_and_is_order_independent():
    s = random_state({"b": (3, 4), "a": (5,), "é": (2,), "Z": (1, 1)})
    s["int"] = torch.arange(3)
    s["scalar"] = torch.tensor(1.5)
    s["empty"] = torch.zeros(0, 3)
    rev = dict(reversed(list(s.items())))
    assert weights_hash(s) == weights_hash(rev) == spec_hash(s)


def test_any_change_changes_the_hash():
    s = random_state({"w": (4, 4), "b": (4,)})
    h = weights_hash(s)
    flipped = {k: v.clone() for k, v in s.items()}
    flipped["w"].view(torch.int16)[1, 2] ^= 1
    reshaped = {"w": s["w"].reshape(2, 8), "b": s["b"]}
    recast = {"w": s["w"].view(torch.float16), "b": s["b"]}
    renamed = {"w2": s["w"], "b": s["b"]}
    hashes = {weights_hash(x) for x in (flipped, reshaped, recast, renamed)}
    assert h not in hashes and len(hashes) == 4


def test_file_hash_equals_state_hash(tmp_path):
    s = random_state({"x.weight": (7, 3), "x.bias": (3,)})
    save_state_file(s, tmp_path / "s.safetensors")
    assert weights_hash_file(tmp_path / "s.safetensors") == weights_hash(s)


def test_file_hash_rejects_garbage(tmp_path):
    for data in (b"", b"\x01", struct.pack("<Q", 1 << 40) + b"{}", struct.pack("<Q", 2) + b"[]"):
        p = tmp_path / "bad"
        p.write_bytes(data)
        try:
            weights_hash_file(p)
        except PatchError:
            continue
        raise AssertionError(f"accepted {data!r}")


def _raw_spec_hash(state):
    """§4's stream over RawTensors, written out here (the module's hash refuses what is tested)."""
    h = blake3.blake3(b"p2prl/weights/v1\x00" + struct.pack("<I", len(state)))
    for name in sorted(state, key=lambda s: s.encode()):
        t, nb = state[name], name.encode()
        h.update(struct.pack("<I", len(nb)) + nb + bytes([len(t.dtype)]) + t.dtype.encode())
        h.update(bytes([len(t.shape)]) + struct.pack(f"<{len(t.shape)}Q", *t.shape))
        h.update(struct.pack("<Q", t.data.nbytes) + t.data.tobytes())
    return h.hexdigest()


def test_bool_elements_are_zero_or_one(tmp_path):
    """A BOOL byte other than 0 or 1 would give one truth value two bit patterns and two hashes: the
    weights hash, a safetensors file's hash and a patch's result all refuse it (all took it)."""
    import numpy as np
    import pytest

    from p2prl.patch.apply import apply_patch
    from p2prl.patch.dtypes import RawTensor
    from p2prl.patch.encode import PatchEncoder

    def state(*bits):
        return {"mask": RawTensor("BOOL", (len(bits),), np.array(bits, np.uint8))}

    good, bad = state(0, 1, 0, 1), state(0, 1, 2, 1)
    assert weights_hash(good) == _raw_spec_hash(good)
    with pytest.raises(PatchError, match="BOOL"):
        weights_hash(bad)
    save_state_file(bad, tmp_path / "bad.safetensors")
    with pytest.raises(PatchError, match="BOOL"):
        weights_hash_file(tmp_path / "bad.safetensors")
    # a patch whose declared result hash is the honest hash of the bad bits still cannot produce them
    enc = PatchEncoder(good, bad, result_hash=_raw_spec_hash(bad))
    patch = b"".join(enc.segments())
    with pytest.raises(PatchError, match="BOOL"):
        apply_patch(good, patch)
    fine = state(1, 1, 0, 1)
    assert weights_hash(apply_patch(good, b"".join(PatchEncoder(good, fine).segments()))) == weights_hash(fine)
