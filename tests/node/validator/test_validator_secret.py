"""The validator's position secret: stable across restarts, bound to its key, not the key itself."""

from __future__ import annotations

from p2prl.crypto.keys import Identity, load_or_create_identity
from p2prl.node.validator.validator import position_secret


def test_position_secret_is_stable_and_key_bound(tmp_path) -> None:
    a = load_or_create_identity(tmp_path / "node.key")
    again = load_or_create_identity(tmp_path / "node.key")  # a restart reads the same key file
    assert position_secret(a) == position_secret(again)
    assert len(position_secret(a)) == 64
    assert a.seed not in position_secret(a)
    assert position_secret(Identity.generate()) != position_secret(a)
