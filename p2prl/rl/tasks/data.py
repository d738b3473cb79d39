"""Data-backed tasks: a local file of records, pinned by its SHA-256 in the genesis.

The file is read once, hashed, and parsed from the same bytes, so what is parsed is exactly what was
verified. The hash is compared before parsing: a node never builds problems from an unpinned file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from p2prl.protocol import is_hex
from p2prl.rl.tasks.base import Task

Record = dict[str, Any]
_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks): the ``data_sha256`` a genesis pins."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _jsonl_records(data: bytes, max_records: int) -> list[Record]:
    out: list[Record] = []
    for i, line in enumerate(data.decode("utf-8").splitlines()):
        if not line.strip():
            continue
        if len(out) >= max_records:
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {i + 1}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"line {i + 1}: a record must be a JSON object")
        out.append(rec)
    return out


def _parquet_records(data: bytes, max_records: int) -> list[Record]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading a Parquet task file needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"not a readable Parquet file ({e})") from None
    return table.slice(0, max_records).to_pylist()


_READERS: dict[str, Callable[[bytes, int], list[Record]]] = {
    ".jsonl": _jsonl_records,
    ".json": _jsonl_records,
    ".parquet": _parquet_records,
}


def parse_records(data: bytes, suffix: str, max_records: int) -> list[Record]:
    """Records of a JSONL (``.jsonl``/``.json``, one object a line) or Parquet (``.parquet``) file."""
    reader = _READERS.get(suffix.lower())
    if reader is None:
        raise ValueError(f"unsupported task file type {suffix!r}; use one of {sorted(_READERS)}")
    return reader(data, max_records)


def _check_sha256(value: str) -> str:
    v = value.strip().lower()
    if not is_hex(v, 32):
        raise ValueError("data_sha256 must be 64 hex characters")
    return v


class DataTask(Task):
    """A task whose problems index into a local file of records, verified against ``data_sha256``.

    ``path`` is where this machine holds the file; ``data_sha256`` is what the genesis pins. With
    ``path`` given, ``data_sha256`` is required; without it the class's packaged ``SAMPLE`` (if any)
    is used, and checked against ``data_sha256`` when one is given. After ``__init__``,
    ``self.records`` holds the parsed records and ``self.data_sha256`` the verified hash.
    """

    SAMPLE: ClassVar[str] = ""  # "package:relative/path" of a small packaged sample, or ""

    def __init__(
        self, path: str | Path | None = None, data_sha256: str | None = None, max_records: int = 1_000_000
    ) -> None:
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        name, data = self._read(path)
        got = hashlib.sha256(data).hexdigest()
        if data_sha256 is None:
            if path is not None:
                raise ValueError(
                    f"task {self.name!r}: data file {path} needs data_sha256 (its hash is {got}); "
                    "network init fills it in"
                )
        elif got != _check_sha256(data_sha256):
            raise ValueError(
                f"task {self.name!r}: data file {name} has sha256 {got}, the genesis pins {data_sha256}"
            )
        self.data_sha256 = got
        self.records = parse_records(data, Path(name).suffix, max_records)
        if not self.records:
            raise ValueError(f"task {self.name!r}: data file {name} has no records")

    @classmethod
    def _read(cls, path: str | Path | None) -> tuple[str, bytes]:
        if path is not None:
            try:
                return str(path), Path(path).read_bytes()
            except OSError as e:
                raise ValueError(f"task {cls.name!r}: cannot read data file {path} ({e.strerror})") from None
        if not cls.SAMPLE:
            raise ValueError(f"task {cls.name!r} needs a data file: pass path=FILE")
        package, _, rel = cls.SAMPLE.partition(":")
        return rel, resources.files(package).joinpath(rel).read_bytes()

    @classmethod
    def pinned_sha256(cls, path: str | Path | None) -> str:
        """The hash ``network init`` pins for this file (or for the packaged sample)."""
        return hashlib.sha256(cls._read(path)[1]).hexdigest()
