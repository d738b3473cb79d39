"""Chunk exchange: serving chunks of complete and partial blobs, and swarm downloads.

A download pulls different chunks from several providers at once (one persistent stream each:
parallel streams on one connection add nothing, several providers do), picks the rarest chunk a
provider has (random among equals, so peers spread out), verifies each chunk against the signed
chunk list on arrival, bans a provider that sends a bad one, and falls back to ranged S3 reads when
no peer makes progress for ``s3_after_s``. Verified chunks are served to others at once.

With ``superseed`` a node serves the k-th copy of a chunk of a complete blob only k-1 cooldowns after
the first and answers BUSY otherwise, so downloaders fetch the rest from each other: the publisher uploads each chunk about
once, not once per peer.
"""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from p2prl.net import chunkproto as cp
from p2prl.net import selection as sel
from p2prl.net.config import NetConfig
from p2prl.net.counters import Counters
from p2prl.net.pacing import UploadPacer
from p2prl.net.partial import PartialBlob, PartialStore
from p2prl.net.store import BlobStore, StoreError
from p2prl.protocol.blobs import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, BlobRef

log = logging.getLogger(__name__)
IDLE_STREAM_S = 30.0
_STREAM_ERRORS: tuple[type[BaseException], ...] = (Exception,)  # libp2p raises many unrelated types


class FetchError(Exception):
    """A blob could not be fetched in time from peers or S3."""


class SwarmContext(Protocol):
    config: NetConfig
    counters: Counters
    s3: Any

    async def open_chunk_stream(self, peer: str) -> Any: ...
    def providers(self, blob_id: str) -> list[str]: ...
    def ban(self, peer: str, reason: str) -> None: ...
    def is_banned(self, peer: str) -> bool: ...


async def close_stream(stream: Any) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except _STREAM_ERRORS:
            pass


class ChunkServer:
    """Answers HAVE and GET on the chunk protocol from the store and from partial downloads."""

    def __init__(self, ctx: SwarmContext, store: BlobStore, partials: PartialStore) -> None:
        self.ctx = ctx
        self.store = store
        self.partials = partials
        self._active = 0
        self._uploads: dict[tuple[str, int], tuple[int, float]] = {}
        rate = ctx.config.max_upload_bytes_per_s
        self.pacer = UploadPacer(rate, max_wait_s=ctx.config.stream_timeout_s / 4) if rate > 0 else None

    async def handle(self, stream: Any) -> None:
        # exceptions raised here would vanish inside libp2p: everything is caught and logged
        try:
            peer = stream.muxed_conn.peer_id.to_base58()
        except Exception:
            peer = "?"
        limit = self.ctx.config.limits.max_serving_streams
        if self.ctx.is_banned(peer) or self._active >= limit:
            self.ctx.counters.add("serve.refused")
            with trio.move_on_after(1.0):
                try:
                    await stream.reset()
                except _STREAM_ERRORS:
                    pass
            return
        self._active += 1
        timeout = self.ctx.config.stream_timeout_s
        try:
            while not self.ctx.is_banned(peer):
                try:
                    req = await cp.read_exactly(stream, cp.REQUEST_BYTES, IDLE_STREAM_S)
                except (cp.ProtocolError, trio.TooSlowError):
                    break
                try:
                    op, blob_id, index, chunk_size = cp.decode_request(req)
                except cp.ProtocolError as e:
                    log.warning("bad chunk request from %s: %s", peer[-8:], e)
                    await cp.write_all(stream, cp.encode_response_header(cp.BAD_REQUEST, 0), timeout)
                    break
                status, payload = self.answer(op, blob_id, index, chunk_size)
                if status == cp.OK and op == cp.OP_GET and self.pacer is not None:
                    wait = self.pacer.reserve(len(payload))
                    if wait is None:  # our uplink is booked: let the downloader ask someone else
                        self.ctx.counters.add("serve.rate_busy")
                        status, payload = cp.BUSY, b""
                    elif wait > 0:
                        await trio.sleep(wait)
                await cp.write_all(stream, cp.encode_response_header(status, len(payload)) + payload, timeout)
                if status == cp.OK and op == cp.OP_GET:
                    self.ctx.counters.add("bytes_up", len(payload))
                    self.ctx.counters.add("chunks_up")
        except _STREAM_ERRORS as e:
            log.debug("chunk stream from %s ended: %r", peer[-8:], e)
        finally:
            self._active -= 1
            await close_stream(stream)

    def answer(self, op: int, blob_id: str, index: int, chunk_size: int) -> tuple[int, bytes]:
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            return cp.BAD_REQUEST, b""
        if self.store.has(blob_id):
            try:
                size = self.store.size(blob_id)
            except StoreError:
                return cp.NOT_FOUND, b""
            n = max(1, -(-size // chunk_size))
            if op == cp.OP_HAVE:
                return (cp.OK, cp.encode_bitmap([True] * n)) if n <= cp.MAX_CHUNKS else (cp.BAD_REQUEST, b"")
            if index >= n:
                return cp.BAD_REQUEST, b""
            if self.ctx.config.superseed and not self._may_upload(blob_id, index):
                return cp.BUSY, b""
            off = index * chunk_size
            try:
                return cp.OK, self.store.read_range(blob_id, off, min(chunk_size, size - off))
            except (StoreError, OSError):
                return cp.NOT_FOUND, b""
        part = self.partials.get(blob_id)
        if part is None or part.ref.chunk_size != chunk_size:
            return cp.NOT_FOUND, b""
        if op == cp.OP_HAVE:
            return cp.OK, cp.encode_bitmap(list(part.have))
        data = part.read(index) if index < part.ref.n_chunks else None
        return (cp.OK, data) if data is not None else (cp.NOT_FOUND, b"")

    def _may_upload(self, blob_id: str, index: int) -> bool:
        return sel.may_upload_copy(
            self._uploads, (blob_id, index), time.monotonic(), self.ctx.config.superseed_cooldown_s
        )


class Download:
    """One blob being fetched into a partial file; ``run`` returns when it is complete."""

    def __init__(
        self,
        ctx: SwarmContext,
        part: PartialBlob,
        on_progress: Callable[[int, int], None] | None = None,
        use_s3: bool = True,
    ) -> None:
        self.ctx = ctx
        self.use_s3 = use_s3
        self.part = part
        self.ref: BlobRef = part.ref
        self.on_progress = on_progress
        self.done = trio.Event()
        self.inflight: set[int] = set()
        self.bitmaps: dict[str, list[bool]] = {}
        self.workers: set[str] = set()
        self.busy: dict[tuple[str, int], float] = {}
        self.retry_after: dict[str, float] = {}
        self.last_peer_progress = time.monotonic()
        self.bytes_from: dict[str, int] = {}
        self.s3_backoff = 0.0
        self.s3_resume_at = 0.0

    def _progress(self, source: str, n: int) -> None:
        self.bytes_from[source] = self.bytes_from.get(source, 0) + n
        if self.on_progress is not None:
            try:
                self.on_progress(
                    sum(self.ref.chunk_len(i) for i, h in enumerate(self.part.have) if h), self.ref.size
                )
            except Exception:
                log.exception("progress callback failed")
        if self.part.complete:
            self.done.set()

    async def run(self, timeout: float) -> None:
        if self.part.complete:
            return
        self._progress("resume", 0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._recruit, nursery)
            if self.ctx.s3 is not None and self.use_s3:
                for _ in range(4):
                    nursery.start_soon(self._s3_worker)
            with trio.move_on_after(timeout):
                await self.done.wait()
            nursery.cancel_scope.cancel()
        if not self.part.complete:
            missing = self.ref.n_chunks - self.part.count
            raise FetchError(
                f"blob {self.ref.id[:16]}: {missing} of {self.ref.n_chunks} chunks missing after {timeout:.0f} s"
            )

    async def _recruit(self, nursery: trio.Nursery) -> None:
        while not self.done.is_set():
            now = time.monotonic()
            for peer in self.ctx.providers(self.ref.id):
                if len(self.workers) >= self.ctx.config.limits.max_providers:
                    break
                if peer in self.workers or self.ctx.is_banned(peer) or self.retry_after.get(peer, 0) > now:
                    continue
                self.workers.add(peer)
                nursery.start_soon(self._worker, peer)
            await trio.sleep(sel.RECRUIT_S)

    def _pick(self, peer: str, bitmap: list[bool]) -> int | None:
        return sel.pick_chunk(
            peer,
            bitmap,
            self.part.have,
            self.inflight,
            self.busy,
            self.bitmaps,
            time.monotonic(),
            self.last_peer_progress,
        )

    async def _send(self, stream: Any, op: int, index: int) -> None:
        req = cp.encode_request(op, self.ref.id, index, self.ref.chunk_size)
        await cp.write_all(stream, req, self.ctx.config.stream_timeout_s)

    async def _response(self, stream: Any, op: int, index: int) -> tuple[int, bytes]:
        max_len = self.ref.chunk_len(index) if op == cp.OP_GET else cp.MAX_HAVE_PAYLOAD
        with trio.fail_after(self.ctx.config.chunk_timeout_s):
            return await cp.read_response(stream, max_len, self.ctx.config.stream_timeout_s)

    async def _worker(self, peer: str) -> None:
        """Pull chunks from one provider over one stream, ``pipeline_depth`` GETs in flight.

        Responses come back in request order, so the provider starts on the next chunk while the
        last one is still on the wire and we verify it: one request at a time would leave the
        stream idle for a round trip plus the provider's disk read per chunk.
        """
        stream: Any = None
        fails = 0
        idle = sel.IDLE_MIN_S
        bitmap: list[bool] | None = None
        pending: collections.deque[int] = collections.deque()
        depth = max(1, self.ctx.config.limits.pipeline_depth)
        try:
            while not self.done.is_set():
                try:
                    if stream is None:
                        stream = await self.ctx.open_chunk_stream(peer)
                    if bitmap is None and not pending:
                        await self._send(stream, cp.OP_HAVE, 0)
                        status, payload = await self._response(stream, cp.OP_HAVE, 0)
                        bitmap = (
                            cp.decode_bitmap(payload, self.ref.n_chunks)
                            if status == cp.OK
                            else [False] * self.ref.n_chunks
                        )
                        self.bitmaps[peer] = bitmap
                    while bitmap is not None and len(pending) < depth:
                        index = self._pick(peer, bitmap)
                        if index is None:
                            break
                        self.inflight.add(index)
                        pending.append(index)
                        await self._send(stream, cp.OP_GET, index)
                    if not pending:
                        await trio.sleep(idle)
                        idle = min(idle * 2, sel.IDLE_MAX_S)
                        if bitmap is not None and not all(bitmap):
                            bitmap = None
                        continue
                    idle = sel.IDLE_MIN_S
                    index = pending[0]
                    status, data = await self._response(stream, cp.OP_GET, index)
                    pending.popleft()
                    self.inflight.discard(index)
                    fails = 0
                    if status == cp.OK:
                        if not self.part.write(index, data):
                            self.ctx.counters.add("bad_chunks")
                            self.ctx.ban(peer, f"served a bad chunk {index} of {self.ref.id[:16]}")
                            return
                        self.ctx.counters.add("bytes_down", len(data))
                        self.last_peer_progress = time.monotonic()
                        self._progress(peer, len(data))
                    elif status == cp.BUSY:
                        self.busy[(peer, index)] = time.monotonic() + sel.BUSY_RETRY_S
                    else:
                        bitmap = None  # it lost the chunk: ask again once the pipeline drains
                except _STREAM_ERRORS as e:
                    fails += 1
                    log.debug("chunk stream to %s failed (%d): %r", peer[-8:], fails, e)
                    for i in pending:
                        self.inflight.discard(i)
                    pending.clear()
                    if stream is not None:
                        await close_stream(stream)
                    stream = None
                    bitmap = None
                    if fails >= 3:
                        self.retry_after[peer] = time.monotonic() + 2.0
                        return
                    await trio.sleep(0.1 * fails)
        finally:
            for i in pending:
                self.inflight.discard(i)
            self.workers.discard(peer)
            self.bitmaps.pop(peer, None)
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await close_stream(stream)

    async def _s3_worker(self) -> None:
        """Ranged S3 reads, only while peers make no progress; backs off while S3 fails."""
        s3 = self.ctx.s3
        while not self.done.is_set():
            await trio.sleep(0.05)
            now = time.monotonic()
            if now - self.last_peer_progress < self.ctx.config.s3_after_s or now < self.s3_resume_at:
                continue
            missing = [
                i for i in range(self.ref.n_chunks) if not self.part.have[i] and i not in self.inflight
            ]
            if not missing:
                continue
            held = list(self.bitmaps.values())
            index = min(missing, key=lambda i: (sum(1 for b in held if b[i]), random.random()))
            self.inflight.add(index)
            try:
                off = index * self.ref.chunk_size
                data = await trio.to_thread.run_sync(
                    s3.get_range, self.ref.id, off, self.ref.chunk_len(index), abandon_on_cancel=True
                )
            except Exception as e:
                self.ctx.counters.add("s3_errors")
                self.s3_backoff = min(max(0.5, self.s3_backoff * 2), 10.0)
                self.s3_resume_at = time.monotonic() + self.s3_backoff
                log.warning(
                    "s3 chunk %d of %s failed (retry in %.1f s): %s",
                    index,
                    self.ref.id[:16],
                    self.s3_backoff,
                    e,
                )
                continue
            finally:
                self.inflight.discard(index)
            self.s3_backoff = 0.0
            if self.part.write(index, data):
                self.ctx.counters.add("bytes_s3", len(data))
                self._progress("s3", len(data))
            else:
                self.ctx.counters.add("s3_bad_chunks")
                self.s3_resume_at = time.monotonic() + 5.0
                log.warning("s3 served a bad chunk %d of %s", index, self.ref.id[:16])
