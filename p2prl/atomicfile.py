"""Files that appear complete or not at all: written to a unique temp file beside the target,
fsynced, then renamed over it (a crash or a concurrent writer never leaves a torn file).

The file gets its mode before a byte is written, so a private file (a key) is never readable by
others, not even for a moment; what a node keeps is private (0600) unless the caller says it is a
public document (the genesis: 0644)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

PRIVATE = 0o600
PUBLIC = 0o644


def write_atomic(path: str | Path, data: bytes | Iterable[bytes], mode: int = PRIVATE) -> int:
    """Write ``data`` (bytes, or chunks of it) to ``path`` atomically with file ``mode`` (not
    masked by the umask); returns the bytes written."""
    path = Path(path)
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    fd, tmp = tempfile.mkstemp(
        dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp"
    )
    n = 0
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
                n += len(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n
