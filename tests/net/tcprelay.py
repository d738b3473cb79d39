"""A TCP relay on 127.0.0.1 between a test and a real node, whose pump a test chooses: what a
crashed host, a peer that stopped reading or a NAT that forgot the flow looks like from the far end."""

from __future__ import annotations

import socket
import threading


class TcpRelay:
    """Accepts on ``port`` and relays each connection to ``target_port``; ``_pump`` moves one direction."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.socks += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed.set()
        for s in [self.listener, *self.socks]:
            try:
                s.close()
            except OSError:
                pass
