"""The node's weights helpers: the reported weights_sha256 is SHA-256 over §4's byte stream; only
verified weights are saved."""

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch

from p2prl.node.weights.disk import load_saved_weights, save_weights
from p2prl.node.weights.version import Weights, sha256_of_state
from p2prl.patch import weights_hash


def spec_stream(state: dict[str, torch.Tensor]) -> bytes:
    """docs/PROTOCOL.md §4's byte stream, written out from the text (dtype names as safetensors names them)."""
    names = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL"}
    out = [b"p2prl/weights/v1\x00", struct.pack("<I", len(state))]
    for name in sorted(state, key=lambda s: s.encode()):
        t, nb, dt = state[name], name.encode(), names[state[name].dtype].encode()
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out += [struct.pack("<I", len(nb)), nb, bytes([len(dt)]), dt, bytes([t.dim()])]
        out += [struct.pack(f"<{t.dim()}Q", *t.shape), struct.pack("<Q", len(raw)), raw]
    return b"".join(out)


def test_weights_sha256_is_sha256_of_the_weights_hash_stream() -> None:
    """docs/NODE.md says "SHA-256 over the same canonical serialization": it used torch's dtype names
    (``bfloat16``), so nobody could reproduce it from the spec."""
    g = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "b": torch.randn(4, generator=g),
        "step": torch.tensor(7),
        "mask": torch.tensor([True, False]),
        "T": torch.randn(4, 3, generator=g).to(torch.bfloat16).t(),  # not contiguous
    }
    stream = spec_stream(state)
    assert sha256_of_state(state) == hashlib.sha256(stream).hexdigest()
    import blake3

    assert weights_hash({k: v.contiguous() for k, v in state.items()}) == blake3.blake3(stream).hexdigest()


def test_only_verified_weights_are_saved(tmp_path: Path) -> None:
    state = {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)}
    with pytest.raises(ValueError, match="unverified"):
        save_weights(Weights.unverified(0, state), tmp_path)
    assert list(tmp_path.iterdir()) == []
    h = weights_hash(state)
    path = save_weights(Weights(3, h, state), tmp_path)
    assert json.loads((tmp_path / "current.json").read_text()) == {"version": 3, "hash": h, "file": path.name}
    w = load_saved_weights(tmp_path)
    assert w is not None and w.verified and (w.version, w.hash) == (3, h) and torch.equal(w.state["w"], state["w"])
