"""Atomic writes: the target appears complete or not at all, and no temp file is left behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2prl.atomicfile import PUBLIC, write_atomic


def test_bytes_and_chunks(tmp_path: Path) -> None:
    p = tmp_path / "a.bin"
    assert write_atomic(p, b"hello") == 5 and p.read_bytes() == b"hello"
    assert write_atomic(p, [b"ab", b"", b"cd"]) == 4 and p.read_bytes() == b"abcd"  # replaces
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a.bin"]


def test_failure_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "a.bin"
    write_atomic(p, b"old")

    def broken() -> Iterator[bytes]:
        yield b"new, half"
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_atomic(p, broken())
    assert p.read_bytes() == b"old"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a.bin"]


def test_mode_is_set_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "public", b"x", mode=PUBLIC)
    finally:
        os.umask(old)
    write_atomic(tmp_path / "private", b"x")
    write_atomic(tmp_path / "public2", b"x", mode=PUBLIC)
    write_atomic(tmp_path / "public2", b"y")  # a rewrite takes the mode it is given
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"public": 0o644, "private": 0o600, "public2": 0o600}
