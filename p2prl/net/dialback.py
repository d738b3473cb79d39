"""Reachability by dial-back (``/p2prl/dialback/1.0.0``): is our listen port open to the world?

py-libp2p's AutoNAT answers over the connection the asker already has, so a node behind a NAT is
told it is reachable (notes: NAT-LIBP2P.md). Here the asker sends only its listen *ports*; the
other side opens a **new** TCP connection from its own host to the address it *observed* the asker
at, with each port, and says which ones accepted. A NATed node's router has no mapping for its
listen port, so the dial fails and the node advertises nothing it cannot keep; a public node (or
one with a forwarded port) learns its public address. The helper can only be made to dial the
asker's own observed address, a few ports, once per ``PER_PEER_S``: no reflection, no scanning.
A request over a relayed connection is refused: the address observed there is the relay's.

    request   n u8 (≤ MAX_PORTS) | n × port u16
    response  ip length u8 | observed ip (ascii) | n u8 | n × ok u8
"""

from __future__ import annotations

import ipaddress
import logging
import struct
import time
from typing import Any

import trio

from p2prl.net import chunkproto as cp
from p2prl.net.conns import is_relayed

log = logging.getLogger(__name__)
PROTOCOL_ID = "/p2prl/dialback/1.0.0"
MAX_PORTS = 4
DIAL_TIMEOUT_S = 3.0
PER_PEER_S = 30.0
MAX_CONCURRENT = 4


def encode_request(ports: list[int]) -> bytes:
    ports = ports[:MAX_PORTS]
    return struct.pack(f">B{len(ports)}H", len(ports), *ports)


def encode_response(ip: str, oks: list[bool]) -> bytes:
    raw = ip.encode()
    return bytes([len(raw)]) + raw + bytes([len(oks)]) + bytes(int(o) for o in oks)


async def _read_exact(stream: Any, n: int, timeout: float) -> bytes:
    return await cp.read_exactly(stream, n, timeout) if n else b""


class DialBackServer:
    """Answers dial-back requests: bounded per peer and in total."""

    def __init__(self, counters: Any) -> None:
        self.counters = counters
        self._last: dict[str, float] = {}
        self._active = 0

    async def handle(self, stream: Any) -> None:
        try:
            await self._handle(stream)
        except Exception as e:  # exceptions vanish inside libp2p handlers
            log.debug("dial-back request failed: %r", e)
        finally:
            with trio.move_on_after(1.0):
                try:
                    await stream.close()
                except Exception:
                    pass

    async def _handle(self, stream: Any) -> None:
        if is_relayed(stream.muxed_conn):  # the observed address would be the relay's, not the asker's
            self.counters.add("dialback.refused_relayed")
            await stream.reset()
            return
        peer = stream.muxed_conn.peer_id.to_base58()
        now = time.monotonic()
        if now - self._last.get(peer, -1e9) < PER_PEER_S or self._active >= MAX_CONCURRENT:
            self.counters.add("dialback.refused")
            await stream.reset()
            return
        self._last[peer] = now
        while len(self._last) > 4096:
            self._last.pop(next(iter(self._last)))
        n = (await _read_exact(stream, 1, 5.0))[0]
        if not 0 < n <= MAX_PORTS:
            raise cp.ProtocolError(f"{n} ports")
        ports = struct.unpack(f">{n}H", await _read_exact(stream, 2 * n, 5.0))
        remote = stream.get_remote_address()
        ip = str(ipaddress.ip_address(remote[0])) if remote else ""
        oks = [False] * n
        self._active += 1
        try:
            if ip:
                async with trio.open_nursery() as nursery:
                    for i, port in enumerate(ports):
                        nursery.start_soon(self._dial, ip, port, oks, i)
        finally:
            self._active -= 1
        self.counters.add("dialback.answered")
        await cp.write_all(stream, encode_response(ip, oks), 5.0)

    async def _dial(self, ip: str, port: int, oks: list[bool], i: int) -> None:
        if port == 0:
            return
        with trio.move_on_after(DIAL_TIMEOUT_S):
            try:
                sock = await trio.open_tcp_stream(ip, port)
                await sock.aclose()
                oks[i] = True
            except OSError:
                pass


async def ask(stream: Any, ports: list[int], timeout: float = DIAL_TIMEOUT_S + 5.0) -> tuple[str, list[bool]]:
    """Ask the peer on ``stream`` to dial us back on ``ports``: our observed ip and which worked."""
    await cp.write_all(stream, encode_request(ports), timeout)
    n_ip = (await _read_exact(stream, 1, timeout))[0]
    ip = (await _read_exact(stream, n_ip, timeout)).decode("ascii", "replace")
    ipaddress.ip_address(ip)  # raises on garbage
    n = (await _read_exact(stream, 1, timeout))[0]
    if n != len(ports[:MAX_PORTS]):
        raise cp.ProtocolError(f"dial-back answered {n} ports for {len(ports)}")
    return ip, [b == 1 for b in await _read_exact(stream, n, timeout)]
