"""Encoding sparse lossless patches between two versions of a state dict (DESIGN §3, docs/PROTOCOL.md §4).

A patch never does float arithmetic: per segment of a tensor it lists the positions whose bit
patterns differ and either the new bit patterns or the zig-zagged integer difference of the bit
patterns, whichever compresses smaller, so applying it (``p2prl.patch.apply``) is exact for any
chain length. Encoding yields segments as they are made, the diff spread over worker threads.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np
import zstandard

from p2prl.patch import intcode
from p2prl.patch.diff import changes
from p2prl.patch.dtypes import TensorLike, dtype_of, shape_of, uint_view
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import (
    INDEX_LEB128,
    INDEX_NONE,
    INDEX_U16ESC,
    KIND_DENSE,
    KIND_SPARSE,
    PREAMBLE,
    SEGMENT_SPAN,
    VALUE_CODINGS,
    VALUE_DELTA,
    VALUE_RAW,
    Header,
    SegmentHead,
    TensorSpec,
    end_record,
    parse_header,
)
from p2prl.patch.hashing import sorted_names, weights_hash

__all__ = ["PatchEncoder", "PatchStats", "encode_patch", "iter_patch"]


DENSE_DIV = 4  # a segment with more than 1/DENSE_DIV of its elements changed is sent dense
VALUE_SAMPLE = 1 << 16  # above this many values, raw-vs-delta is decided on a sample
WINDOW = 8  # segments in flight per encoder (at least two per thread): bounds memory, keeps the threads busy
# segments encoded at once by default: the machine's cores, 2 to 8 (the result hash has its own thread)
THREADS = max(2, min(8, (os.cpu_count() or 2) - 1))
DEFAULT_INDEX_CODING = "u16esc"
_INDEX_BY_NAME = {"leb128": INDEX_LEB128, "u16esc": INDEX_U16ESC}
_tls = threading.local()


def _compress(raw: bytes, level: int) -> bytes:
    cache = getattr(_tls, "cctx", None)
    if cache is None or cache[0] != level:
        cache = (level, zstandard.ZstdCompressor(level=level, write_content_size=True))
        _tls.cctx = cache
    return cache[1].compress(raw)


def _specs(state: Mapping[str, TensorLike]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, dtype_of(state[n]).name, shape_of(state[n])) for n in sorted_names(state))


@dataclass
class PatchStats:
    """What an encoder produced, for the CLI and the benchmark."""

    numel: int = 0
    changed: int = 0
    segments: int = 0
    dense_segments: int = 0
    index_bytes: int = 0
    value_bytes: int = 0
    value_codings: dict[str, int] = field(default_factory=lambda: {"raw": 0, "delta": 0})
    total_bytes: int = 0

    @property
    def bits_per_changed(self) -> float:
        return 8 * self.total_bytes / self.changed if self.changed else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "numel": self.numel,
            "changed": self.changed,
            "changed_fraction": self.changed / self.numel if self.numel else 0.0,
            "segments": self.segments,
            "dense_segments": self.dense_segments,
            "index_bytes": self.index_bytes,
            "value_bytes": self.value_bytes,
            "value_codings": dict(self.value_codings),
            "bytes": self.total_bytes,
            "bits_per_changed": self.bits_per_changed,
        }


def _pick_values(cands: list[tuple[int, np.ndarray]], level: int) -> tuple[int, bytes, bytes]:
    """(coding, raw, compressed) of whichever candidate stream compresses smaller."""
    n = cands[0][1].size
    if n > VALUE_SAMPLE:
        trial = [len(_compress(intcode.shuffle(a[:VALUE_SAMPLE]), level)) for _, a in cands]
        coding, arr = cands[int(np.argmin(trial))]
        raw = intcode.shuffle(arr)
        return coding, raw, _compress(raw, level)
    best: tuple[int, bytes, bytes] | None = None
    for coding, arr in cands:
        raw = intcode.shuffle(arr)
        comp = _compress(raw, level)
        if best is None or len(comp) < len(best[2]):
            best = (coding, raw, comp)
    assert best is not None
    return best


# bytes, record, changed positions and their new bit patterns (both None: dense)
Encoded = tuple[bytes, SegmentHead, "np.ndarray | None", "np.ndarray | None"]


def _encode_segment(
    ti: int, start: int, old: np.ndarray, new: np.ndarray, level: int, index_coding: str
) -> Encoded | None:
    span = old.size
    count, changed = changes(old, new, span // DENSE_DIV)
    if count == 0:
        return None
    if changed is None:  # more than 1/DENSE_DIV changed
        coding, vraw, vcomp = _pick_values(
            [(VALUE_DELTA, intcode.zigzag_diff(new, old)), (VALUE_RAW, new)], level
        )
        head = SegmentHead(
            KIND_DENSE, coding, INDEX_NONE, ti, start, span, count, 0, 0, len(vraw), len(vcomp)
        )
        return head.pack() + vcomp, head, None, None
    pos, nv, ov = changed
    coding, vraw, vcomp = _pick_values(
        [(VALUE_DELTA, intcode.zigzag_diff(nv, ov)), (VALUE_RAW, nv)], level
    )
    gaps = intcode.positions_to_gaps(pos)
    if index_coding == "auto":
        options = [
            (INDEX_U16ESC, intcode.u16esc_encode(gaps)),
            (INDEX_LEB128, intcode.leb128_encode(gaps)),
        ]
        packed = [(ic, raw, _compress(raw, level)) for ic, raw in options]
        ic, iraw, icomp = min(packed, key=lambda x: len(x[2]))
    else:
        ic = _INDEX_BY_NAME[index_coding]
        iraw = intcode.u16esc_encode(gaps) if ic == INDEX_U16ESC else intcode.leb128_encode(gaps)
        icomp = _compress(iraw, level)
    head = SegmentHead(
        KIND_SPARSE, coding, ic, ti, start, span, count, len(iraw), len(icomp), len(vraw), len(vcomp)
    )
    return head.pack() + icomp + vcomp, head, pos, nv


class PatchEncoder:
    """Streams the patch from ``base`` to ``new``: ``segments()`` yields bytes as they are made.

    ``base_hash``/``result_hash`` may be passed when the caller already knows them (the trainer
    knows the hash of what it last published); otherwise they are computed, the result hash on its
    own thread beside the diff. After ``segments()`` is exhausted, ``base_hash``, ``result_hash``
    and ``stats`` describe the patch and ``changes`` lists what it changes, per segment (tensor
    index, start, positions or None for a dense segment): enough to bring a copy of ``base`` up to
    ``new`` by writing the changed elements only (``ChainPublisher``).
    """

    def __init__(
        self,
        base: Mapping[str, TensorLike],
        new: Mapping[str, TensorLike],
        *,
        zstd_level: int = 1,
        base_hash: str | None = None,
        result_hash: str | None = None,
        index_coding: str = DEFAULT_INDEX_CODING,
        threads: int = THREADS,
        segment_span: int = SEGMENT_SPAN,
    ) -> None:
        if index_coding not in (*_INDEX_BY_NAME, "auto"):
            raise ValueError(f"index_coding must be leb128, u16esc or auto, not {index_coding!r}")
        self.specs = _specs(base)
        if self.specs != _specs(new):
            raise PatchError(PatchReason.BAD_INPUT, "base and new differ in tensor names, dtypes or shapes")
        self.base, self.new = base, new
        self.zstd_level = zstd_level
        self.base_hash = base_hash
        self.result_hash = result_hash
        self.index_coding = index_coding
        self.threads = max(1, threads)
        self.segment_span = segment_span
        # The decoder's own header rules, applied before any work: never write what apply rejects.
        probe = Header(base_hash="0" * 64, tensors=self.specs, zstd_level=zstd_level).to_bytes()
        parse_header(probe[PREAMBLE.size :])
        self.stats = PatchStats(numel=sum(s.numel for s in self.specs))
        # per segment changed: tensor index, start, positions and new bit patterns (None: dense)
        self.changes: list[tuple[int, int, np.ndarray | None, np.ndarray | None]] = []

    def _work(self) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        for ti, spec in enumerate(self.specs):
            old, new = uint_view(self.base[spec.name]), uint_view(self.new[spec.name])
            for start in range(0, old.size, self.segment_span):
                end = min(start + self.segment_span, old.size)
                yield ti, start, old[start:end], new[start:end]

    def segments(self) -> Iterator[bytes]:
        if self.base_hash is None:
            self.base_hash = weights_hash(self.base)
        header = Header(base_hash=self.base_hash, tensors=self.specs, zstd_level=self.zstd_level).to_bytes()
        self.stats.total_bytes = len(header)
        digest = blake3.blake3(header)
        yield header
        n_segments = 0
        hashed: list[str | PatchError] = []

        def hash_new() -> None:
            try:
                hashed.append(weights_hash(self.new))
            except PatchError as e:  # e.g. a BOOL byte neither 0 nor 1: raised by segments() below
                hashed.append(e)

        hasher: threading.Thread | None = None
        if self.result_hash is None:  # its own thread: both workers keep diffing
            hasher = threading.Thread(target=hash_new, name="patch-hash")
            hasher.start()
        try:
            with ThreadPoolExecutor(self.threads, thread_name_prefix="patch-enc") as pool:
                pending: deque[Future[Encoded | None]] = deque()
                level, ic = self.zstd_level, self.index_coding

                def drain(fut: Future[Encoded | None]) -> bytes | None:
                    out = fut.result()
                    if out is None:
                        return None
                    data, head, pos, nv = out
                    self._account(head, len(data))
                    self.changes.append((head.tensor, head.start, pos, nv))
                    return data

                for ti, start, old, new in self._work():
                    pending.append(pool.submit(_encode_segment, ti, start, old, new, level, ic))
                    if len(pending) >= max(WINDOW, 2 * self.threads):
                        data = drain(pending.popleft())
                        if data is not None:
                            n_segments += 1
                            digest.update(data)
                            yield data
                while pending:
                    data = drain(pending.popleft())
                    if data is not None:
                        n_segments += 1
                        digest.update(data)
                        yield data
        finally:
            if hasher is not None:
                hasher.join()
        if hasher is not None:
            if not hashed:
                raise PatchError(PatchReason.BAD_INPUT, "the new state could not be hashed")
            if isinstance(hashed[0], PatchError):
                raise hashed[0]
            self.result_hash = hashed[0]
        assert self.result_hash is not None
        tail = end_record(n_segments, self.result_hash, digest.digest())
        self.stats.total_bytes += len(tail)
        yield tail

    def _account(self, head: SegmentHead, nbytes: int) -> None:
        s = self.stats
        s.segments += 1
        s.changed += head.count
        s.dense_segments += head.kind == KIND_DENSE
        s.index_bytes += head.index_len
        s.value_bytes += head.value_len
        s.value_codings[VALUE_CODINGS[head.value_coding]] += 1
        s.total_bytes += nbytes


def encode_patch(
    base: Mapping[str, TensorLike], new: Mapping[str, TensorLike], *, zstd_level: int = 1
) -> bytes:
    """The whole patch from ``base`` to ``new`` as bytes."""
    return b"".join(PatchEncoder(base, new, zstd_level=zstd_level).segments())


def iter_patch(
    base: Mapping[str, TensorLike], new: Mapping[str, TensorLike], *, zstd_level: int = 1
) -> Iterator[bytes]:
    """Streaming form of encode_patch: header, then each segment as soon as it is encoded."""
    return PatchEncoder(base, new, zstd_level=zstd_level).segments()
