"""Sparse lossless patches between two versions of a state dict (DESIGN §3, docs/PROTOCOL.md §4).

A patch never does float arithmetic: per segment of a tensor it lists the positions whose bit
patterns differ and either the new bit patterns or the zig-zagged integer difference of the bit
patterns, whichever compresses smaller, so applying it is exact for any chain length. Encoding
yields segments as they are made; ``PatchApplier`` applies them into a staging copy as bytes arrive
and hands the result out only once its weights hash matches the one the patch promises.
"""

from __future__ import annotations

import struct
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
from p2prl.patch.dtypes import BY_NAME, TensorLike, dtype_of, empty_like, shape_of, uint_view
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import (
    CODEC,
    END,
    FORMAT_VERSION,
    INDEX_CODINGS,
    INDEX_LEB128,
    INDEX_NONE,
    INDEX_U16ESC,
    KIND_DENSE,
    KIND_END,
    KIND_SPARSE,
    PREAMBLE,
    RECORD_BYTES,
    SEGMENT_SPAN,
    VALUE_CODINGS,
    VALUE_DELTA,
    VALUE_RAW,
    Header,
    SegmentHead,
    TensorSpec,
    end_record,
    parse_end,
    parse_header,
    parse_preamble,
    parse_segment,
    zstd_unpack,
)
from p2prl.patch.hashing import DOMAIN, _entry_prefix, sorted_names, weights_hash

DENSE_DIV = 4  # a segment with more than 1/DENSE_DIV of its elements changed is sent dense
VALUE_SAMPLE = 1 << 16  # above this many values, raw-vs-delta is decided on a sample
FINALISE_CHUNK = 1 << 20  # elements copied then hashed at a time (still in cache for the hash)
WINDOW = 8  # segments in flight per encoder: bounds memory while keeping the threads busy
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


def _encode_segment(
    ti: int, start: int, old: np.ndarray, new: np.ndarray, level: int, index_coding: str
) -> tuple[bytes, SegmentHead] | None:
    pos = np.flatnonzero(old != new)
    count = pos.size
    if count == 0:
        return None
    span = old.size
    if count * DENSE_DIV > span:
        coding, vraw, vcomp = _pick_values(
            [(VALUE_DELTA, intcode.zigzag_diff(new, old)), (VALUE_RAW, new)], level
        )
        head = SegmentHead(
            KIND_DENSE, coding, INDEX_NONE, ti, start, span, count, 0, 0, len(vraw), len(vcomp)
        )
        return head.pack() + vcomp, head
    nv = new[pos]
    coding, vraw, vcomp = _pick_values(
        [(VALUE_DELTA, intcode.zigzag_diff(nv, old[pos])), (VALUE_RAW, nv)], level
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
    return head.pack() + icomp + vcomp, head


class PatchEncoder:
    """Streams the patch from ``base`` to ``new``: ``segments()`` yields bytes as they are made.

    ``base_hash``/``result_hash`` may be passed when the caller already knows them (the trainer
    knows the hash of what it last published); otherwise they are computed, the result hash on a
    worker thread beside the diff. After ``segments()`` is exhausted, ``base_hash``,
    ``result_hash`` and ``stats`` describe the patch.
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
        threads: int = 2,
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
        with ThreadPoolExecutor(self.threads, thread_name_prefix="patch-enc") as pool:
            hash_job: Future[str] | None = None
            if self.result_hash is None:
                hash_job = pool.submit(weights_hash, self.new)
            pending: deque[Future[tuple[bytes, SegmentHead] | None]] = deque()
            level, ic = self.zstd_level, self.index_coding

            def drain(fut: Future[tuple[bytes, SegmentHead] | None]) -> bytes | None:
                out = fut.result()
                if out is None:
                    return None
                data, head = out
                self._account(head, len(data))
                return data

            for ti, start, old, new in self._work():
                pending.append(pool.submit(_encode_segment, ti, start, old, new, level, ic))
                if len(pending) >= WINDOW:
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
            if hash_job is not None:
                self.result_hash = hash_job.result()
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


def check_base(header: Header, base: Mapping[str, TensorLike]) -> None:
    """The base must hold exactly the tensors the patch was made against (names, dtypes, shapes)."""
    names = {s.name for s in header.tensors}
    if set(base) != names:
        missing = sorted(names - set(base))[:1] or sorted(set(base) - names)[:1]
        raise PatchError(PatchReason.WRONG_BASE, f"base does not match the patch: tensor sets differ (e.g. {missing[0]!r})")
    for s in header.tensors:
        t = base[s.name]
        if dtype_of(t).name != s.dtype or shape_of(t) != s.shape:
            raise PatchError(PatchReason.WRONG_BASE, f"base does not match the patch: {s.name} is {dtype_of(t).name}{list(t.shape)}")


class PatchApplier:
    """Applies a patch as its bytes arrive, into a staging copy; ``base`` is never modified.

    ``feed`` consumes bytes in any split; ``finish`` returns the new state only when the whole
    patch arrived and the result's weights hash equals the one the patch declares. After any
    error the applier is dead and its staging copy dropped. Tensors the patch does not touch are
    shared with ``base`` (treat both as immutable). Pass ``base_hash`` only when the caller has
    itself verified that ``base`` hashes to it (e.g. it is the result of the previous apply).

    ``staging`` (optional) is a state dict of the same names, dtypes and shapes whose contents
    may be overwritten (a node's spare buffer): the result is then built entirely in it, so a
    node can double-buffer and never pay for fresh allocations. It must not share memory with
    ``base``; on failure its contents are undefined.
    """

    def __init__(
        self,
        base: Mapping[str, TensorLike],
        *,
        base_hash: str | None = None,
        staging: Mapping[str, TensorLike] | None = None,
    ) -> None:
        self._base = base
        self._spare = staging
        self._known_base_hash = base_hash
        self._buf = bytearray()
        self._header: Header | None = None
        self._hlen: int | None = None
        self._seg: SegmentHead | None = None
        self._prev_end = (0, 0)
        self._segments = 0
        self._result_hash: str | None = None
        self._staging: dict[int, TensorLike] = {}
        self._views: dict[int, np.ndarray] = {}
        # the result is finalised (copied, patched and hashed) in canonical order up to here
        self._cursor = (0, 0)
        self._entered = -1  # the last tensor whose hash prefix is in self._result
        self._result = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._error: PatchError | None = None  # once set, every later call fails with it
        self._digest = blake3.blake3()
        self.received = 0

    @property
    def header(self) -> Header | None:
        return self._header

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._failed()
        try:
            if self._result_hash is not None and len(data):
                raise PatchError(PatchReason.MALFORMED, "trailing bytes after the end of the patch")
            self._buf += data
            self.received += len(data)
            self._advance()
        except PatchError as e:
            self._fail(e)
            raise
        except (ValueError, IndexError, KeyError, OverflowError, MemoryError, TypeError, struct.error) as e:
            raise self._fail(PatchError(PatchReason.MALFORMED, f"malformed patch: {e}")) from None

    def _fail(self, error: PatchError) -> PatchError:
        """The applier is dead from here on: drop its staging copy and remember why."""
        self._error = error
        self._staging.clear()
        self._views.clear()
        self._buf = bytearray()
        return error

    def _failed(self) -> PatchError:
        """A fresh copy of the error that killed the applier (one exception object per raise)."""
        assert self._error is not None
        return PatchError(self._error.reason, self._error.detail)

    def _advance(self) -> None:
        buf = self._buf
        pos = 0
        while self._result_hash is None:
            avail = len(buf) - pos
            if self._header is None:
                if self._hlen is None:
                    if avail < PREAMBLE.size:
                        break
                    self._hlen = parse_preamble(memoryview(buf)[pos : pos + PREAMBLE.size])
                    pos += PREAMBLE.size
                    continue
                if avail < self._hlen:
                    break
                header = parse_header(bytes(buf[pos : pos + self._hlen]))
                pos += self._hlen
                self._accept_header(header)
                continue
            if self._seg is None:
                if avail < 1:
                    break
                if buf[pos] == KIND_END:
                    if avail < END.size:
                        break
                    self._hash_consumed(buf, pos)  # drops buf[:pos]: the end record is now at 0
                    n, result_hash, digest = parse_end(bytes(buf[: END.size]))
                    pos = END.size
                    if n != self._segments:
                        raise PatchError(PatchReason.MALFORMED, f"end record counts {n} segments, {self._segments} arrived")
                    if digest != self._digest.digest():
                        raise PatchError(PatchReason.HASH_MISMATCH, "patch digest mismatch: the patch is corrupted")
                    self._result_hash = result_hash
                    break
                if avail < RECORD_BYTES:
                    break
                rec = bytes(buf[pos : pos + RECORD_BYTES])
                pos += RECORD_BYTES
                self._seg = parse_segment(rec, self._header, self._prev_end)
                continue
            seg = self._seg
            if avail < seg.payload_len:
                break
            mv = memoryview(buf)
            try:
                self._apply_segment(
                    seg, mv[pos : pos + seg.index_len], mv[pos + seg.index_len : pos + seg.payload_len]
                )
            finally:
                mv.release()
            pos += seg.payload_len
            self._prev_end = (seg.tensor, seg.start + seg.span)
            self._segments += 1
            self._seg = None
        if self._result_hash is None:
            self._hash_consumed(buf, pos)
        else:
            del buf[:pos]
            if buf:
                raise PatchError(PatchReason.MALFORMED, "trailing bytes after the end of the patch")

    def _hash_consumed(self, buf: bytearray, pos: int) -> None:
        """Feed the consumed prefix ``buf[:pos]`` to the patch digest and drop it."""
        mv = memoryview(buf)
        part = mv[:pos]
        self._digest.update(part)
        part.release()
        mv.release()
        del buf[:pos]

    def _accept_header(self, header: Header) -> None:
        check_base(header, self._base)
        if self._spare is not None:
            check_base(header, self._spare)
        have = self._known_base_hash
        if have is None:
            have = weights_hash(self._base)
        if have != header.base_hash:
            raise PatchError(
                PatchReason.WRONG_BASE,
                f"wrong base: weights hash {have[:16]}…, the patch needs {header.base_hash[:16]}…",
            )
        self._header = header
        self._result.update(DOMAIN + struct.pack("<I", len(header.tensors)))

    def _view(self, ti: int) -> np.ndarray:
        v = self._views.get(ti)
        if v is None:
            assert self._header is not None
            name = self._header.tensors[ti].name
            src = self._base[name]
            staged = self._spare[name] if self._spare is not None else empty_like(src)
            self._staging[ti] = staged
            v = self._views[ti] = uint_view(staged)
        return v

    def _advance_to(self, ti: int, start: int) -> None:
        """Finalise the result up to element ``start`` of tensor ``ti``: copy what no segment
        touches and hash it while it is still in cache. Tensors never touched (when there is no
        ``staging``) are shared with the base and hashed from it."""
        assert self._header is not None
        cur_t, cur_off = self._cursor
        n = len(self._header.tensors)
        while cur_t < n and (cur_t, cur_off) < (ti, start):
            spec = self._header.tensors[cur_t]
            numel = spec.numel
            self._enter(cur_t)
            end = numel if cur_t < ti else start
            if end > cur_off:
                src = uint_view(self._base[spec.name])
                if cur_t == ti or cur_t in self._views or self._spare is not None:
                    dst = self._view(cur_t)
                    for a in range(cur_off, end, FINALISE_CHUNK):
                        b = min(end, a + FINALISE_CHUNK)
                        np.copyto(dst[a:b], src[a:b])
                        self._result.update(memoryview(dst[a:b]).cast("B"))
                else:
                    self._result.update(memoryview(src[cur_off:end]).cast("B"))
            if cur_t < ti:
                cur_t, cur_off = cur_t + 1, 0
            else:
                cur_off = end
        self._cursor = (cur_t, cur_off)

    def _enter(self, ti: int) -> None:
        """Hash tensor ``ti``'s name, dtype, shape and size once, before its first byte."""
        assert self._header is not None
        if self._entered < ti:
            spec = self._header.tensors[ti]
            nbytes = spec.numel * BY_NAME[spec.dtype].itemsize
            self._result.update(_entry_prefix(spec.name, spec.dtype, spec.shape, nbytes))
            self._entered = ti

    def _apply_segment(self, seg: SegmentHead, iframe: memoryview, vframe: memoryview) -> None:
        assert self._header is not None
        self._advance_to(seg.tensor, seg.start)
        self._enter(seg.tensor)
        end = seg.start + seg.span
        target = self._view(seg.tensor)[seg.start : end]
        np.copyto(target, uint_view(self._base[self._header.tensors[seg.tensor].name])[seg.start : end])
        self._decode_into(seg, iframe, vframe, target)
        self._result.update(memoryview(target).cast("B"))
        self._cursor = (seg.tensor, end)

    def _decode_into(
        self, seg: SegmentHead, iframe: memoryview, vframe: memoryview, target: np.ndarray
    ) -> None:
        assert self._header is not None
        d = BY_NAME[self._header.tensors[seg.tensor].dtype]
        n_vals = seg.count if seg.kind == KIND_SPARSE else seg.span
        vals = intcode.unshuffle(zstd_unpack(vframe, seg.value_raw), d.uint, n_vals)
        if seg.kind == KIND_SPARSE:
            iraw = zstd_unpack(iframe, seg.index_raw)
            if seg.index_coding == INDEX_LEB128:
                gaps = intcode.leb128_decode(iraw, seg.count)
            else:
                gaps = intcode.u16esc_decode(iraw, seg.count)
            pos = intcode.gaps_to_positions(gaps, seg.span)
            old = target[pos]
            new = intcode.unzigzag_add(old, vals) if seg.value_coding == VALUE_DELTA else vals
            if np.any(new == old):
                raise PatchError(PatchReason.MALFORMED, "segment lists an element that does not change")
            target[pos] = new
            return
        if seg.value_coding == VALUE_DELTA:
            changed = int(np.count_nonzero(vals))
            new = intcode.unzigzag_add(target, vals)
        else:
            new = vals
            changed = int(np.count_nonzero(new != target))
        if changed != seg.count:
            raise PatchError(PatchReason.MALFORMED, f"dense segment changes {changed} elements, declares {seg.count}")
        target[...] = new

    def finish(self) -> dict[str, TensorLike]:
        """The patched state, only if the patch is complete and the result hash matches."""
        if self._error is not None:
            raise self._failed()
        if self._header is None or self._result_hash is None:
            raise self._fail(PatchError(PatchReason.MALFORMED, "truncated patch: the end record never arrived"))
        try:
            self._advance_to(len(self._header.tensors), 0)
        except PatchError as e:
            self._fail(e)
            raise
        out: dict[str, TensorLike] = {}
        for ti, spec in enumerate(self._header.tensors):
            out[spec.name] = self._staging[ti] if ti in self._staging else self._base[spec.name]
        got = self._result.hexdigest()
        if got != self._result_hash:
            raise self._fail(
                PatchError(
                    PatchReason.HASH_MISMATCH,
                    f"result hash mismatch: got {got[:16]}…, the patch promises {self._result_hash[:16]}…",
                )
            )
        self._staging = {}
        self._views = {}
        return out

    @property
    def result_hash(self) -> str | None:
        return self._result_hash


def apply_patch(
    base: Mapping[str, TensorLike],
    patch: bytes | bytearray | memoryview,
    *,
    base_hash: str | None = None,
    staging: Mapping[str, TensorLike] | None = None,
) -> dict[str, TensorLike]:
    """Apply a whole patch: verifies the base hash first and the result hash last; never mutates
    ``base``. ``base_hash`` and ``staging`` are as for PatchApplier."""
    applier = PatchApplier(base, base_hash=base_hash, staging=staging)
    applier.feed(patch)
    return applier.finish()


def read_header(patch: bytes | bytearray | memoryview) -> tuple[Header, int]:
    """The parsed header of a patch and the offset of its first record."""
    mv = memoryview(patch)
    if len(mv) < PREAMBLE.size:
        raise PatchError(PatchReason.MALFORMED, "truncated patch: shorter than its preamble")
    hlen = parse_preamble(mv[: PREAMBLE.size])
    if len(mv) < PREAMBLE.size + hlen:
        raise PatchError(PatchReason.MALFORMED, "truncated patch: header cut short")
    return parse_header(bytes(mv[PREAMBLE.size : PREAMBLE.size + hlen])), PREAMBLE.size + hlen


def inspect_patch(patch: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Header, per-tensor counts and sizes of a patch, JSON-able; checks framing, not contents."""
    mv = memoryview(patch)
    header, pos = read_header(mv)
    per = [
        {
            "name": s.name,
            "dtype": s.dtype,
            "shape": list(s.shape),
            "numel": s.numel,
            "changed": 0,
            "segments": 0,
            "dense_segments": 0,
            "index_bytes": 0,
            "value_bytes": 0,
            "value_codings": {"raw": 0, "delta": 0},
            "index_codings": {"leb128": 0, "u16esc": 0},
        }
        for s in header.tensors
    ]
    prev = (0, 0)
    n = 0
    result_hash = None
    while True:
        if len(mv) - pos >= 1 and mv[pos] == KIND_END:
            if len(mv) - pos < END.size:
                raise PatchError(PatchReason.MALFORMED, "truncated patch: end record cut short")
            count, result_hash, digest = parse_end(mv[pos : pos + END.size])
            if count != n:
                raise PatchError(PatchReason.MALFORMED, f"end record counts {count} segments, the patch holds {n}")
            if digest != blake3.blake3(mv[:pos]).digest():
                raise PatchError(PatchReason.HASH_MISMATCH, "patch digest mismatch: the patch is corrupted")
            pos += END.size
            break
        if len(mv) - pos < RECORD_BYTES:
            raise PatchError(PatchReason.MALFORMED, "truncated patch: record cut short")
        rec = mv[pos : pos + RECORD_BYTES]
        pos += RECORD_BYTES
        seg = parse_segment(rec, header, prev)
        if len(mv) - pos < seg.payload_len:
            raise PatchError(PatchReason.MALFORMED, "truncated patch: segment payload cut short")
        pos += seg.payload_len
        prev = (seg.tensor, seg.start + seg.span)
        n += 1
        t = per[seg.tensor]
        t["changed"] += seg.count
        t["segments"] += 1
        t["dense_segments"] += seg.kind == KIND_DENSE
        t["index_bytes"] += seg.index_len
        t["value_bytes"] += seg.value_len
        t["value_codings"][VALUE_CODINGS[seg.value_coding]] += 1
        if seg.kind == KIND_SPARSE:
            t["index_codings"][INDEX_CODINGS[seg.index_coding]] += 1
    if pos != len(mv):
        raise PatchError(PatchReason.MALFORMED, "trailing bytes after the end of the patch")
    numel = sum(s.numel for s in header.tensors)
    changed = sum(t["changed"] for t in per)
    return {
        "format_version": FORMAT_VERSION,
        "codec": header.codec,
        "zstd_level": header.zstd_level,
        "base_hash": header.base_hash,
        "result_hash": result_hash,
        "bytes": len(mv),
        "tensors": per,
        "n_tensors": len(per),
        "segments": n,
        "numel": numel,
        "changed": changed,
        "changed_fraction": changed / numel if numel else 0.0,
        "bits_per_changed": 8 * len(mv) / changed if changed else 0.0,
    }


__all__ = [
    "CODEC",
    "END",
    "PatchApplier",
    "PatchEncoder",
    "PatchStats",
    "apply_patch",
    "check_base",
    "encode_patch",
    "inspect_patch",
    "iter_patch",
    "read_header",
]
