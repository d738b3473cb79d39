"""Applying a patch as its bytes arrive, into a staging copy, verified by the result's weights hash.

``PatchApplier`` parses, checks and applies each segment while the rest is still on its way, copies
and hashes the untouched ranges in canonical order beside it (so the result hash costs no second
pass), and hands the new state out only once that hash matches the one the patch promises.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import blake3
import numpy as np

from p2prl.patch import intcode
from p2prl.patch.dtypes import (
    BY_NAME,
    TensorLike,
    check_bool_bits,
    dtype_of,
    empty_like,
    shape_of,
    uint_view,
)
from p2prl.patch.errors import PatchError, PatchReason
from p2prl.patch.format import (
    END,
    INDEX_LEB128,
    KIND_END,
    KIND_SPARSE,
    PREAMBLE,
    RECORD_BYTES,
    VALUE_DELTA,
    Header,
    SegmentHead,
    parse_end,
    parse_header,
    parse_preamble,
    parse_segment,
    zstd_unpack,
)
from p2prl.patch.hashing import DOMAIN, entry_prefix, weights_hash

__all__ = ["PatchApplier", "SegmentChange", "apply_patch", "check_base"]

SegmentChange = tuple[int, int, "np.ndarray | None", np.ndarray]  # tensor, start, positions, old ^ new


FINALISE_CHUNK = 1 << 20  # elements copied then hashed at a time (still in cache for the hash)
# verify_only: segments decoded on worker threads while this one patches and hashes in order, a
# cache-sized piece at a time (the patched bytes are hashed before they ever reach memory), the hash
# on BLAKE3's own threads where cores are left beside the workers and the generation loop (a 16-core
# GPU host: 7 workers, 8 hashing threads, 16 MiB pieces; 2 cores: one of each, 2 MiB)
_CPUS = os.cpu_count() or 1
CHECK_WORKERS = max(1, min(8, _CPUS // 2 - 1))
CHECK_HASH_THREADS = max(1, _CPUS - CHECK_WORKERS - 1)
CHECK_INFLIGHT = 32  # segments decoded ahead of the hash at most (their positions and values only)
CHECK_AHEAD_BYTES = 64 << 20  # and at most about this much decoded ahead (dense segments are whole spans)
CHECK_CHUNK_BYTES = (1 << 21) * min(CHECK_HASH_THREADS, 8)  # 2 MiB of a piece per hashing thread
DECODE_WORKERS = max(1, min(8, _CPUS))  # hash_result=False: no hashing thread, so the decode takes its cores

# what decoding bytes a peer made may raise besides PatchError: the patch is malformed
_MALFORMED = (ValueError, IndexError, KeyError, OverflowError, MemoryError, TypeError, struct.error)

# a decoded segment: int64 positions (None: dense), uint32 positions and old ^ new for the record
# (None when nothing is recorded), new
_Checked = tuple["np.ndarray | None", "np.ndarray | None", "np.ndarray | None", np.ndarray]


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two views start at the same address (the staging copy is the base: applied in place)."""
    return bool(a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def check_base(header: Header, base: Mapping[str, TensorLike]) -> None:
    """The base must hold exactly the tensors the patch was made against (names, dtypes, shapes)."""
    names = {s.name for s in header.tensors}
    if set(base) != names:
        missing = sorted(names - set(base))[:1] or sorted(set(base) - names)[:1]
        raise PatchError(
            PatchReason.WRONG_BASE,
            f"base does not match the patch: tensor sets differ (e.g. {missing[0]!r})",
        )
    for s in header.tensors:
        t = base[s.name]
        if dtype_of(t).name != s.dtype or shape_of(t) != s.shape:
            raise PatchError(
                PatchReason.WRONG_BASE,
                f"base does not match the patch: {s.name} is {dtype_of(t).name}{list(t.shape)}",
            )


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
    ``base`` unless the patch is already known good (``staging=base`` applies in place; on failure
    its contents are undefined).

    ``verify_only`` checks a patch without keeping its result: each segment is decoded once, on a
    worker thread, while this thread hashes the result in order, copying the base a cache-sized piece
    at a time into one buffer and laying the new bits over it, so checking costs one read of the
    model, one hash pass and one pass over the changed elements, the decode beside the hash, and
    ``finish`` returns an empty dict. ``record`` (a list) receives, per
    segment, what it changed: ``(tensor index, start,
    positions or None for a dense segment, old XOR new bit patterns)``, enough to step the result
    back to the base and forward again in place; with ``verify_only`` it is what a caller XORs into
    ``base`` once the patch checked out (node/weights/live.py: one decode per switch, not two). ``values``
    (a list) receives beside it each segment's int64 positions (None: dense) and new bit patterns
    (at the positions; dense: all), so that write needs no read of the old bits and no conversion.

    ``base_views`` (optional): ``uint_view`` of each base tensor, made once by a caller that checks
    many patches against the same tensors (a node's live weights), instead of per patch.

    ``hash_result=False`` (with ``verify_only``) decodes and checks each segment but does not hash the
    result: for a node that writes a signed patch first and hashes its live weights after, beside
    generation (node/weights/live.py, ``LiveWeights.confirm``); ``finish`` then vouches for the
    patch's own digest and segments only, not for the result.
    """

    def __init__(
        self,
        base: Mapping[str, TensorLike],
        *,
        base_hash: str | None = None,
        staging: Mapping[str, TensorLike] | None = None,
        verify_only: bool = False,
        record: list[SegmentChange] | None = None,
        values: list[tuple[np.ndarray | None, np.ndarray]] | None = None,
        hash_result: bool = True,
        base_views: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if verify_only and staging is not None:
            raise ValueError("verify_only keeps no result: no staging")
        if not hash_result and not verify_only:
            raise ValueError("only verify_only may leave the result unhashed")
        self._hashing = hash_result
        # the base's bits as unsigned integers, per tensor (``base_views``: a caller's, made once)
        self._src: dict[str, np.ndarray] = dict(base_views) if base_views is not None else {}
        self._base = base
        self._spare = staging
        self._verify_only = verify_only
        self._record = record
        self._values = values
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
        # verify_only: what is still to be hashed, in order (bytes of the base, or a segment being
        # decoded on a worker), and the workers
        self._pending: deque[memoryview | tuple[int, int, np.ndarray, int, Future[_Checked]]] = deque()
        self._ahead = 0  # bytes the segments being decoded hold, about
        self._pool: ThreadPoolExecutor | None = None
        self._chunk: np.ndarray | None = None  # verify_only: the one cache-sized piece patched and hashed
        # the result is finalised (copied, patched and hashed) in canonical order up to here
        self._cursor = (0, 0)
        self._entered = -1  # the last tensor whose hash prefix is in self._result
        # a check's hash takes only the cores its decoding workers and the generation loop leave
        self._result = blake3.blake3(max_threads=CHECK_HASH_THREADS if verify_only else blake3.blake3.AUTO)
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
        except _MALFORMED as e:
            raise self._fail(PatchError(PatchReason.MALFORMED, f"malformed patch: {e}")) from None

    def _fail(self, error: PatchError) -> PatchError:
        """The applier is dead from here on: drop its staging copy and remember why."""
        self._error = error
        self._close_pool()
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
                        raise PatchError(
                            PatchReason.MALFORMED,
                            f"end record counts {n} segments, {self._segments} arrived",
                        )
                    if digest != self._digest.digest():
                        raise PatchError(
                            PatchReason.HASH_MISMATCH,
                            "patch digest mismatch: the patch is corrupted",
                        )
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

    def _src_view(self, name: str) -> np.ndarray:
        v = self._src.get(name)
        if v is None:
            v = self._src[name] = uint_view(self._base[name])
        return v

    def _advance_to(self, ti: int, start: int) -> None:
        """Finalise the result up to element ``start`` of tensor ``ti``: copy what no segment
        touches and hash it while it is still in cache. Tensors never touched (when there is no
        ``staging``) are shared with the base and hashed from it."""
        assert self._header is not None
        if not self._hashing:  # decode only: nothing to copy or hash between segments
            return
        cur_t, cur_off = self._cursor
        n = len(self._header.tensors)
        while cur_t < n and (cur_t, cur_off) < (ti, start):
            spec = self._header.tensors[cur_t]
            numel = spec.numel
            self._enter(cur_t)
            end = numel if cur_t < ti else start
            if end > cur_off:
                src = self._src_view(spec.name)
                copy = cur_t == ti or cur_t in self._views or self._spare is not None
                if copy and not self._verify_only and not _same_memory(self._view(cur_t), src):
                    dst = self._view(cur_t)
                    for a in range(cur_off, end, FINALISE_CHUNK):
                        b = min(end, a + FINALISE_CHUNK)
                        np.copyto(dst[a:b], src[a:b])
                        self._result.update(memoryview(dst[a:b]).cast("B"))
                else:
                    self._hash_base(memoryview(src[cur_off:end]).cast("B"))
            if cur_t < ti:
                cur_t, cur_off = cur_t + 1, 0
            else:
                cur_off = end
        self._cursor = (cur_t, cur_off)

    def _enter(self, ti: int) -> None:
        """Hash tensor ``ti``'s name, dtype, shape and size once, before its first byte."""
        assert self._header is not None
        if self._entered < ti and self._hashing:
            spec = self._header.tensors[ti]
            nbytes = spec.numel * BY_NAME[spec.dtype].itemsize
            self._hash_base(memoryview(entry_prefix(spec.name, spec.dtype, spec.shape, nbytes)))
            self._entered = ti

    def _apply_segment(self, seg: SegmentHead, iframe: memoryview, vframe: memoryview) -> None:
        assert self._header is not None
        self._advance_to(seg.tensor, seg.start)
        self._enter(seg.tensor)
        spec = self._header.tensors[seg.tensor]
        end = seg.start + seg.span
        src = self._src_view(spec.name)[seg.start : end]
        if self._verify_only:  # decoded on a worker; patched and hashed here, in order
            if self._pool is None:
                workers = CHECK_WORKERS if self._hashing else DECODE_WORKERS
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="p2prl-check")
            job = self._pool.submit(self._check_segment, seg, bytes(iframe), bytes(vframe), src)
            held = (seg.span if seg.kind != KIND_SPARSE else seg.count) * 12  # about what its decode holds
            self._pending.append((seg.tensor, seg.start, src, held, job))
            self._ahead += held
            self._drain(CHECK_INFLIGHT)
            self._cursor = (seg.tensor, end)
            return
        pos, old, new = self._decode(seg, iframe, vframe, src)
        self._keep(seg.tensor, seg.start, pos, *self._recorded(pos, old, new), new)
        target = self._view(seg.tensor)[seg.start : end]
        if pos is None:
            target[...] = new
        else:
            if not _same_memory(target, src):
                np.copyto(target, src)
            target[pos] = new
        check_bool_bits(spec.dtype, target, spec.name)  # the untouched rest was checked when hashed
        self._result.update(memoryview(target).cast("B"))
        self._cursor = (seg.tensor, end)

    def _recorded(
        self, pos: np.ndarray | None, old: np.ndarray, new: np.ndarray
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """What ``record`` keeps of a segment besides its place: uint32 positions (None: dense) and
        old XOR new; (None, None) when nothing is recorded."""
        if self._record is None:
            return None, None
        return (None if pos is None else pos.astype(np.uint32)), old ^ new

    def _keep(
        self, ti: int, start: int, pos: np.ndarray | None, pos32: np.ndarray | None, flips: np.ndarray | None, new: np.ndarray
    ) -> None:
        if self._record is not None:
            assert flips is not None
            self._record.append((ti, start, pos32, flips))
        if self._values is not None:
            self._values.append((pos, new))

    def _check_segment(self, seg: SegmentHead, iframe: bytes, vframe: bytes, src: np.ndarray) -> _Checked:
        """On a worker: one segment decoded and checked (``src`` is only read), with what the record
        keeps computed here rather than on the hashing thread."""
        pos, old, new = self._decode(seg, memoryview(iframe), memoryview(vframe), src)
        return pos, *self._recorded(pos, old, new), new

    def _hash_patched(self, src: np.ndarray, pos: np.ndarray | None, new: np.ndarray, name: str, dtype: str) -> None:
        """Hash ``src`` with ``new`` laid over it at ``pos``, a cache-sized piece at a time: each is
        copied into one reused buffer, patched and hashed while still in cache, so the check reads
        the model once and writes nothing the size of it."""
        if not self._hashing:
            return
        if pos is None:
            check_bool_bits(dtype, new, name)
            self._result.update(memoryview(new).cast("B"))
            return
        step = max(1, CHECK_CHUNK_BYTES // src.itemsize)
        buf = self._chunk
        if buf is None or buf.dtype != src.dtype:
            buf = self._chunk = np.empty(step, src.dtype)
        cuts = np.searchsorted(pos, np.arange(0, src.size + step, step))
        for i, a in enumerate(range(0, src.size, step)):
            b = min(src.size, a + step)
            piece = buf[: b - a]
            np.copyto(piece, src[a:b])
            lo, hi = int(cuts[i]), int(cuts[i + 1])
            if hi > lo:
                piece[pos[lo:hi] - a] = new[lo:hi]
            check_bool_bits(dtype, piece, name)
            self._result.update(memoryview(piece).cast("B"))

    def _hash_base(self, data: memoryview) -> None:
        """Hash ``data`` after whatever is still pending (segments being decoded come first)."""
        if self._pending:
            self._pending.append(data)
        else:
            self._result.update(data)

    def _drain(self, keep: int) -> None:
        """Hash what is pending, in order: what is ready, and beyond ``keep`` entries also what is not."""
        assert self._header is not None
        while self._pending:
            head = self._pending[0]
            if isinstance(head, memoryview):
                self._result.update(self._pending.popleft())
                continue
            ti, start, src, held, job = head
            if len(self._pending) <= keep and self._ahead <= CHECK_AHEAD_BYTES and not job.done():
                return
            self._pending.popleft()
            self._ahead -= held
            pos, pos32, flips, new = job.result()  # a worker's PatchError is raised here
            self._keep(ti, start, pos, pos32, flips, new)
            spec = self._header.tensors[ti]
            self._hash_patched(src, pos, new, spec.name, spec.dtype)

    def _close_pool(self) -> None:
        for entry in self._pending:
            if not isinstance(entry, memoryview):
                entry[4].cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _decode(
        self, seg: SegmentHead, iframe: memoryview, vframe: memoryview, src: np.ndarray
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """(positions, old bits, new bits) of one segment, checked: a sparse segment's positions are
        sorted, in range and each changes its element; a dense one's new bits cover the span (positions
        None) and change exactly ``count`` elements. ``src`` is only read."""
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
            old = src[pos]
            new = intcode.unzigzag_add(old, vals) if seg.value_coding == VALUE_DELTA else vals
            if np.any(new == old):
                raise PatchError(PatchReason.MALFORMED, "segment lists an element that does not change")
            return pos, old, new
        if seg.value_coding == VALUE_DELTA:
            changed = int(np.count_nonzero(vals))
            new = intcode.unzigzag_add(src, vals)
        else:
            new = vals
            changed = int(np.count_nonzero(new != src))
        if changed != seg.count:
            raise PatchError(
                PatchReason.MALFORMED,
                f"dense segment changes {changed} elements, declares {seg.count}",
            )
        return None, src, new

    def finish(self) -> dict[str, TensorLike]:
        """The patched state, only if the patch is complete and the result hash matches."""
        if self._error is not None:
            raise self._failed()
        if self._header is None or self._result_hash is None:
            truncated = PatchError(PatchReason.MALFORMED, "truncated patch: the end record never arrived")
            raise self._fail(truncated)
        try:
            self._advance_to(len(self._header.tensors), 0)
            self._drain(0)
        except PatchError as e:
            self._fail(e)
            raise
        except _MALFORMED as e:
            raise self._fail(PatchError(PatchReason.MALFORMED, f"malformed patch: {e}")) from None
        finally:
            if self._error is None:
                self._close_pool()
        out: dict[str, TensorLike] = {}
        for ti, spec in enumerate(self._header.tensors if not self._verify_only else ()):
            out[spec.name] = self._staging[ti] if ti in self._staging else self._base[spec.name]
        got = self._result.hexdigest() if self._hashing else self._result_hash
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
