"""A free local TCP port, for a listen address that must be known before its host starts (a genesis's
bootstrap entry, a status endpoint named in a plan)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race is acceptable on one machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
