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
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from p2prl.net import chunkproto as cp
from p2prl.net import selection as sel
from p2prl.net.config import NetConfig
from p2prl.net.conns import is_relayed
from p2prl.net.counters import Counters
from p2prl.net.pacing import UploadPacer
from p2prl.net.partial import PartialBlob, PartialStore
from p2prl.net.refs import RefBook
from p2prl.protocol import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, BlobRef
from p2prl.reasons import BanReason
from p2prl.store import BlobStore, StoreError

log = logging.getLogger(__name__)
IDLE_STREAM_S = 30.0
HAVE_REFRESH_S = 0.1  # how stale a partial provider's bitmap may get while chunks are in flight
_HAVE = -1  # a HAVE request in a worker's pipeline
BUSY_COMPLETE_S = 0.05  # a complete holder said BUSY: ask it again (for any chunk) after this
PROVIDER_FAILS = 3  # stream failures in a row before a provider rests ...
PROVIDER_REST_S = 2.0  # ... this long (others, or S3, carry the download meanwhile)
S3_WORKERS = 4  # parallel ranged GETs of one download's S3 fallback
PACER_WAIT_SHARE = 0.25  # an upload waits for the pacer at most this share of the stream timeout
_STREAM_ERRORS: tuple[type[BaseException], ...] = (Exception,)  # libp2p raises many unrelated types


class FetchError(Exception):
    """A blob could not be fetched in time from peers or S3."""


class SwarmContext(Protocol):
    config: NetConfig
    counters: Counters
    s3: Any

    async def open_chunk_stream(self, peer: str) -> Any: ...
    def providers(self, blob_id: str) -> list[str]: ...
    def drop_hint(self, blob_id: str, peer: str) -> None: ...
    def ban(self, peer: str, reason: str) -> None: ...
    def is_banned(self, peer: str) -> bool: ...


async def close_stream(stream: Any) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except _STREAM_ERRORS:
            pass


class _Slot:
    """One inbound chunk stream: whose it is, since when it waits for a request, how to end it."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.idle_since: float | None = None
        self.scope = trio.CancelScope()


class ChunkServer:
    """Answers HAVE and GET on the chunk protocol from the store and from partial downloads."""

    def __init__(
        self, ctx: SwarmContext, store: BlobStore, partials: PartialStore, refs: RefBook | None = None
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.partials = partials
        self.refs = refs or RefBook(store)
        self._hashing = trio.Lock()  # one on-demand ref computation at a time
        self._slots: set[_Slot] = set()
        self._uploads: dict[tuple[str, int], tuple[int, float]] = {}
        self._seeding = 0  # superseed chunk uploads on the wire now
        rate = ctx.config.max_upload_bytes_per_s
        wait = ctx.config.stream_timeout_s * PACER_WAIT_SHARE
        self.pacer = UploadPacer(rate, max_wait_s=wait) if rate > 0 else None

    async def handle(self, stream: Any) -> None:
        # exceptions raised here would vanish inside libp2p: everything is caught and logged
        try:
            peer = stream.muxed_conn.peer_id.to_base58()
        except Exception:
            peer = "?"
        if self.ctx.is_banned(peer):
            refusal = "serve.refused"
        elif is_relayed(getattr(stream, "muxed_conn", None)):
            refusal = "serve.refused_relayed"  # patches stay off relays: a relay is for control traffic
        else:
            refusal = self._admit(peer)
        if refusal:
            self.ctx.counters.add(refusal)
            with trio.move_on_after(1.0):
                try:
                    await stream.reset()
                except _STREAM_ERRORS:
                    pass
            return
        slot = _Slot(peer)
        self._slots.add(slot)
        try:
            with slot.scope:
                await self._serve(stream, slot)
        except _STREAM_ERRORS as e:
            log.debug("chunk stream from %s ended: %r", peer[-8:], e)
        finally:
            self._slots.discard(slot)
            await close_stream(stream)

    def _admit(self, peer: str) -> str:
        """Room for one more stream from ``peer``? The refusal counter if not ("" = admitted).

        One peer holds at most ``max_streams_per_peer`` slots; when every slot is taken, the stream
        that has waited longest for its next request gives way (``serve.evicted_idle``), so peers
        that keep slots open with a rare tiny request cannot lock out one that downloads."""
        limits = self.ctx.config.limits
        if sum(1 for s in self._slots if s.peer == peer) >= limits.max_streams_per_peer:
            return "serve.refused_peer_cap"
        if len(self._slots) < limits.max_serving_streams:
            return ""
        now = time.monotonic()
        idle = [
            s for s in self._slots if s.idle_since is not None and now - s.idle_since >= limits.evict_idle_s
        ]
        if not idle:
            return "serve.refused"
        victim = min(idle, key=lambda s: s.idle_since or now)
        victim.scope.cancel()
        self._slots.discard(victim)
        self.ctx.counters.add("serve.evicted_idle")
        return ""

    async def _serve(self, stream: Any, slot: _Slot) -> None:
        timeout = self.ctx.config.stream_timeout_s
        while not self.ctx.is_banned(slot.peer):
            slot.idle_since = time.monotonic()
            try:
                req = await cp.read_exactly(stream, cp.REQUEST_BYTES, IDLE_STREAM_S)
            except (cp.ProtocolError, trio.TooSlowError):
                return
            slot.idle_since = None
            try:
                op, blob_id, digest, index, chunk_size = cp.decode_request(req)
            except cp.ProtocolError as e:
                log.warning("bad chunk request from %s: %s", slot.peer[-8:], e)
                await cp.write_all(stream, cp.encode_response_header(cp.BAD_REQUEST, 0), timeout)
                return
            await self._learn_ref(blob_id, digest, chunk_size)
            status, payload = self.answer(op, blob_id, digest, index, chunk_size)
            if status == cp.OK and op == cp.OP_GET and self.pacer is not None:
                wait = self.pacer.reserve(len(payload))
                if wait is None:  # our uplink is booked: let the downloader ask someone else
                    self.ctx.counters.add("serve.rate_busy")
                    status, payload = cp.BUSY, b""
                elif wait > 0:
                    await trio.sleep(wait)
            seeding = self.ctx.config.superseed and status == cp.OK and op == cp.OP_GET
            self._seeding += seeding
            try:
                await cp.write_all(stream, cp.encode_response_header(status, len(payload)) + payload, timeout)
            finally:
                self._seeding -= seeding
            if status == cp.OK and op == cp.OP_GET:
                self.ctx.counters.add("bytes_up", len(payload))
                self.ctx.counters.add("chunks_up")

    async def _learn_ref(self, blob_id: str, digest: str, chunk_size: int) -> None:
        """A held blob asked for under a digest we do not know: compute our own ref of it once."""
        if self.refs.get(digest) is not None or self.partials.get(digest) is not None:
            return
        if not self.refs.may_compute(blob_id, chunk_size):
            return
        async with self._hashing:
            await trio.to_thread.run_sync(self.refs.compute, blob_id, chunk_size)

    def answer(self, op: int, blob_id: str, digest: str, index: int, chunk_size: int) -> tuple[int, bytes]:
        """Answer under the ref named by ``digest`` only: NOT_FOUND for a ref we do not hold."""
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            return cp.BAD_REQUEST, b""
        ref = self.refs.get(digest)
        if ref is not None and ref.id == blob_id and ref.chunk_size == chunk_size and self.store.has(blob_id):
            if op == cp.OP_HAVE:
                return cp.OK, cp.encode_bitmap([True] * ref.n_chunks)
            if index >= ref.n_chunks:
                return cp.BAD_REQUEST, b""
            if self.ctx.config.superseed and not self._may_upload(blob_id, index):
                return cp.BUSY, b""
            try:
                return cp.OK, self.store.read_range(blob_id, index * chunk_size, ref.chunk_len(index))
            except (StoreError, OSError):
                return cp.NOT_FOUND, b""
        part = self.partials.get(digest)
        if part is None or part.ref.id != blob_id or part.ref.chunk_size != chunk_size:
            return cp.NOT_FOUND, b""
        if op == cp.OP_HAVE:
            return cp.OK, cp.encode_bitmap(list(part.have))
        data = part.read(index) if index < part.ref.n_chunks else None
        return (cp.OK, data) if data is not None else (cp.NOT_FOUND, b"")

    def _may_upload(self, blob_id: str, index: int) -> bool:
        return sel.may_upload_copy(
            self._uploads,
            (blob_id, index),
            time.monotonic(),
            self.ctx.config.superseed_cooldown_s,
            in_flight=self._seeding,
        )


class Download:
    """One blob being fetched into a partial file; ``run`` returns when it is complete."""

    def __init__(
        self,
        ctx: SwarmContext,
        part: PartialBlob,
        on_progress: Callable[[int, int], None] | None = None,
        use_s3: bool = True,
        reserved: Sequence[str] = (),
    ) -> None:
        self.ctx = ctx
        self.use_s3 = use_s3
        self.reserved = tuple(dict.fromkeys(reserved))  # always get a worker, beyond max_providers
        self.part = part
        self.ref: BlobRef = part.ref
        self.on_progress = on_progress
        self.done = trio.Event()
        self.inflight: set[int] = set()
        self.bitmaps: dict[str, list[bool]] = {}
        self.workers: set[str] = set()
        self.busy: dict[tuple[str, int], float] = {}
        self.retry_after: dict[str, float] = {}
        self.retired: dict[str, int] = {}  # peer -> times it was given a slot and delivered nothing
        self.crowded = False  # every provider slot taken and another provider waiting
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
                for _ in range(S3_WORKERS):
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
        """Give providers workers: the reserved ones (announcer, trainer) always, the others up to
        ``max_providers``, those retired least often first, so peers that only claim to hold the
        blob cannot keep the real holders waiting (docs/SECURITY.md, item 6)."""
        limit = self.ctx.config.limits.max_providers
        while not self.done.is_set():
            now = time.monotonic()
            pool = [p for p in self.ctx.providers(self.ref.id) if p not in self.reserved]
            pool.sort(key=lambda p: self.retired.get(p, 0))  # stable: hinted peers still first
            self.crowded = False
            for peer in [*self.reserved, *pool]:
                if peer in self.workers or self.ctx.is_banned(peer) or self.retry_after.get(peer, 0) > now:
                    continue
                if peer not in self.reserved and len(self.workers.difference(self.reserved)) >= limit:
                    self.crowded = True  # a provider waits for a slot: idle holders should give theirs up
                    break
                self.workers.add(peer)
                nursery.start_soon(self._worker, peer)
            await trio.sleep(sel.RECRUIT_S)

    def _offers(self, bitmap: list[bool] | None) -> bool:
        return bitmap is not None and any(b and not h for b, h in zip(bitmap, self.part.have, strict=True))

    def _retire(self, peer: str) -> None:
        """``peer`` held a slot for ``hint_grace_s`` and delivered nothing: back off, forget its hint."""
        n = self.retired.get(peer, 0) + 1
        self.retired[peer] = n
        self.retry_after[peer] = time.monotonic() + min(60.0, 5.0 * 2 ** (n - 1))
        self.ctx.counters.add("providers_retired")
        self.ctx.drop_hint(self.ref.id, peer)

    def _pick(self, peer: str, bitmap: list[bool]) -> int | None:
        now = time.monotonic()
        if self.busy.get((peer, _HAVE), 0.0) > now:  # a superseeding publisher's uplink is booked
            return None
        return sel.pick_chunk(
            peer,
            bitmap,
            self.part.have,
            self.inflight,
            self.busy,
            self.bitmaps,
            now,
            self.last_peer_progress,
        )

    async def _send(self, stream: Any, op: int, index: int) -> None:
        req = cp.encode_request(op, self.ref.id, self.ref.digest, index, self.ref.chunk_size)
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
        have_at = 0.0
        pending: collections.deque[int] = collections.deque()
        depth = max(1, self.ctx.config.limits.pipeline_depth)
        probation = time.monotonic() + self.ctx.config.hint_grace_s if peer not in self.reserved else math.inf
        asked = False
        useful = False  # its last bitmap held a chunk we lack
        try:
            while not self.done.is_set():
                if time.monotonic() > probation and (asked or (self.crowded and not useful)):
                    self._retire(peer)  # asked and never delivered, or holds nothing we lack while
                    return  # another provider waits for its slot
                try:
                    if stream is None:
                        stream = await self.ctx.open_chunk_stream(peer)
                    if bitmap is None and not pending:
                        await self._send(stream, cp.OP_HAVE, 0)
                        status, payload = await self._response(stream, cp.OP_HAVE, 0)
                        bitmap = self._bitmap(peer, status, payload)
                        useful = self._offers(bitmap)
                        have_at = time.monotonic()
                    elif (
                        pending
                        and _HAVE not in pending
                        and bitmap is not None
                        and time.monotonic() - have_at > HAVE_REFRESH_S
                        and not all(bitmap)
                    ):
                        # a partial provider gains a chunk every fraction of a second: ask what it
                        # holds between GETs instead of after the pipeline drains (on a rate-limited
                        # link, a drained pipeline leaves the uplink idle for a round trip or more)
                        await self._send(stream, cp.OP_HAVE, 0)
                        pending.append(_HAVE)
                        have_at = time.monotonic()
                    while bitmap is not None and len(pending) - (_HAVE in pending) < depth:
                        index = self._pick(peer, bitmap)
                        if index is None:
                            break
                        self.inflight.add(index)
                        pending.append(index)
                        asked = True
                        await self._send(stream, cp.OP_GET, index)
                    if not pending:
                        await trio.sleep(idle)
                        partial = bitmap is not None and not all(bitmap)
                        idle = min(idle * 2, HAVE_REFRESH_S if partial else sel.IDLE_MAX_S)
                        if partial:
                            bitmap = None
                        continue
                    idle = sel.IDLE_MIN_S
                    index = pending[0]
                    if index == _HAVE:
                        status, payload = await self._response(stream, cp.OP_HAVE, 0)
                        pending.popleft()
                        bitmap = self._bitmap(peer, status, payload)
                        useful = self._offers(bitmap)
                        continue
                    status, data = await self._response(stream, cp.OP_GET, index)
                    pending.popleft()
                    self.inflight.discard(index)
                    fails = 0
                    if status == cp.OK:
                        if not self.part.write(index, data):
                            self.ctx.counters.add("bad_chunks")
                            self.ctx.ban(peer, f"{BanReason.BAD_CHUNK}: chunk {index} of {self.ref.id[:16]}")
                            return
                        self.ctx.counters.add("bytes_down", len(data))
                        self.last_peer_progress = time.monotonic()
                        probation = math.inf
                        self._progress(peer, len(data))
                    elif status == cp.BUSY:
                        self.busy[(peer, index)] = time.monotonic() + sel.BUSY_RETRY_S
                        if all(bitmap or ()):  # a superseeding publisher: its uplink is booked
                            self.busy[(peer, _HAVE)] = time.monotonic() + BUSY_COMPLETE_S
                    else:
                        bitmap = None  # it lost the chunk: ask again once the pipeline drains
                except _STREAM_ERRORS as e:
                    fails += 1
                    log.debug("chunk stream to %s failed (%d): %r", peer[-8:], fails, e)
                    self.inflight.difference_update(pending)
                    pending.clear()
                    if stream is not None:
                        await close_stream(stream)
                    stream = None
                    bitmap = None
                    if fails >= PROVIDER_FAILS:
                        self.retry_after[peer] = time.monotonic() + PROVIDER_REST_S
                        return
                    await trio.sleep(0.1 * fails)
        finally:
            self.inflight.difference_update(pending)
            self.workers.discard(peer)
            self.bitmaps.pop(peer, None)
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await close_stream(stream)

    def _bitmap(self, peer: str, status: int, payload: bytes) -> list[bool]:
        bitmap = (
            cp.decode_bitmap(payload, self.ref.n_chunks) if status == cp.OK else [False] * self.ref.n_chunks
        )
        self.bitmaps[peer] = bitmap
        return bitmap

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
