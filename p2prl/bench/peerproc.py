"""A node in a child process, driven over a pipe (the fan-out benchmark and multi-process tests).

Peers on one machine must be separate processes to measure anything real (one interpreter's GIL
would serialise them) and to be killed mid-transfer. Commands, each answered with one reply::

    ("addrs",)                      -> list of multiaddrs
    ("connect", [addr, ...])        -> number connected
    ("put", seed, size)             -> blob id of deterministic random bytes, stored and served
    ("fetch", ref_body, timeout)    -> {"ok", "seconds", "sha256_ok", "error"}
    ("hint", blob_id, peer_id)      -> None
    ("stats",)                      -> stats dict
    ("reach",)                      -> (reachable or None, advertised addrs)
    ("relay",)                      -> {"carried": {peer: bytes}, "relays": {peer: addr}, "conns": ...}
    ("cpu",)                        -> CPU seconds (user + system) this process has used
    ("subscribe", topic)            -> None
    ("poll", timeout)               -> [[topic, envelope type, from peer, version or None], ...]
    ("stop",)                       -> None, then the process exits

``netns`` runs the node inside a testbed host (p2prl/testbed), ``listen`` sets its listen address;
``relay`` (a dict of ``RelayBounds`` fields) makes it a relay for NATed peers.
``behaviour`` "corrupt" flips a byte in every chunk served; "slow" sleeps before each chunk.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import random
import time
from typing import Any

from p2prl.crypto import Identity
from p2prl.net.config import Limits, NetConfig, RelayBounds
from p2prl.net.s3 import S3Config
from p2prl.protocol import BlobRef
from p2prl.store import BlobStore


def blob_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _server_class(behaviour: str, delay_s: float) -> type[Any]:
    """The chunk server of an honest peer, or of one that corrupts ("corrupt") or delays ("slow")
    every chunk it serves."""
    from p2prl.net import chunkproto as cp
    from p2prl.net.swarm import ChunkServer

    if behaviour == "honest":
        return ChunkServer

    class HostileServer(ChunkServer):
        def answer(self, op: int, blob_id: str, digest: str, index: int, chunk_size: int) -> tuple[int, bytes]:
            status, payload = super().answer(op, blob_id, digest, index, chunk_size)
            if op == cp.OP_GET and status == cp.OK:
                if behaviour == "corrupt" and payload:
                    payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
                elif behaviour == "slow":
                    time.sleep(delay_s)
            return status, payload

    return HostileServer


def _peer_main(conn: Any, seed: bytes, network: str, root: str, opts: dict[str, Any]) -> None:
    if opts.get("netns"):  # a testbed host: enter its namespace before any socket exists
        from p2prl.testbed import enter

        enter(opts["netns"])
    # trio and libp2p load only now, inside the host's namespace
    from p2prl.net.node import P2PNode

    logging.basicConfig(level=opts.get("log_level", "WARNING"))
    # libp2p logs an ERROR for every stream it fails to open to a peer that is shutting down
    logging.getLogger("libp2p").setLevel(opts.get("libp2p_log_level", "CRITICAL"))
    s3 = S3Config(**opts["s3"]) if opts.get("s3") else None
    cfg = NetConfig(
        listen=opts.get("listen", NetConfig.listen),
        superseed=opts.get("superseed", False),
        s3=s3,
        s3_after_s=opts.get("s3_after_s", 3.0),
        stream_timeout_s=opts.get("stream_timeout_s", 10.0),
        chunk_timeout_s=opts.get("chunk_timeout_s", 10.0),
        limits=Limits(pipeline_depth=opts.get("pipeline_depth", Limits.pipeline_depth)),
        max_upload_bytes_per_s=opts.get("max_upload_bytes_per_s", 0.0),
        relay=RelayBounds(**opts["relay"]) if opts.get("relay") is not None else None,
        hole_punch=opts.get("hole_punch", True),
    )
    server = _server_class(opts.get("behaviour", "honest"), opts.get("delay_s", 0.05))
    node = P2PNode(Identity(seed), network, BlobStore(root), cfg, server_class=server)
    node.start()
    try:
        while True:
            cmd = conn.recv()
            op = cmd[0]
            if op == "addrs":
                conn.send(node.addrs)
            elif op == "connect":
                n = 0
                for a in cmd[1]:
                    try:
                        node.connect(a)
                        n += 1
                    except Exception as e:
                        logging.warning("connect %s: %r", a, e)
                conn.send(n)
            elif op == "put":
                bid = node.store.put(blob_bytes(cmd[1], cmd[2]))
                conn.send(bid)
            elif op == "fetch":
                ref = BlobRef.from_body(cmd[1])
                t0 = time.monotonic()
                try:
                    path = node.fetch(ref, timeout=cmd[2])
                    secs = time.monotonic() - t0
                    h = hashlib.sha256(path.read_bytes()).hexdigest()
                    conn.send({"ok": True, "seconds": secs, "sha256_ok": h == ref.id, "error": ""})
                except Exception as e:
                    conn.send(
                        {"ok": False, "seconds": time.monotonic() - t0, "sha256_ok": False, "error": repr(e)}
                    )
            elif op == "hint":
                node.add_provider_hint(cmd[1], cmd[2])
                conn.send(None)
            elif op == "reach":
                conn.send((node.reachable, node.advertised_addrs()))
            elif op == "relay":
                conn.send({**node.relay_stats(), "conns": node.connections()})
            elif op == "stats":
                conn.send(node.stats())
            elif op == "cpu":
                t = os.times()
                conn.send(t.user + t.system)
            elif op == "subscribe":
                node.subscribe(cmd[1])
                conn.send(None)
            elif op == "poll":
                conn.send(
                    [
                        [i.topic, i.envelope.type, i.from_peer, getattr(i.message, "version", None)]
                        for i in node.poll(cmd[1])
                    ]
                )
            elif op == "stop":
                break
    finally:
        node.stop()
        conn.send(None)


class PeerProcess:
    """Handle on a node running in a child process."""

    def __init__(
        self, root: str, network: str = "bench", seed: bytes | None = None, wait: bool = True, **opts: Any
    ) -> None:
        ctx = mp.get_context("spawn")
        self.identity = Identity(seed) if seed else Identity.generate()
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_peer_main, args=(child, self.identity.seed, network, root, opts), daemon=True
        )
        self.proc.start()
        self.addrs: list[str] = []
        self.peer_id = ""
        if wait:
            self.ready()

    def ready(self, timeout: float = 120.0) -> PeerProcess:
        """Wait until the child's host listens (start many children first, then wait for all)."""
        if not self.addrs:
            self.addrs = self.call("addrs", timeout=timeout)
            self.peer_id = self.addrs[0].rsplit("/p2p/", 1)[1]
        return self

    def call(self, *cmd: Any, timeout: float = 120.0) -> Any:
        self._conn.send(cmd)
        if not self._conn.poll(timeout):
            raise TimeoutError(f"peer process did not answer {cmd[0]} in {timeout} s")
        return self._conn.recv()

    def send(self, *cmd: Any) -> None:
        """Send without waiting (collect the reply later with ``recv``)."""
        self._conn.send(cmd)

    def recv(self, timeout: float = 120.0) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"peer process did not answer in {timeout} s")
        return self._conn.recv()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(10)

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("stop", timeout=30)
            except (TimeoutError, OSError, EOFError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.kill()
        self._conn.close()
