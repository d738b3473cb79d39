"""Watchdog of one testbed: waits for EOF on stdin (its owner exited, however it died), then
deletes whatever namespaces of the testbed are left, with the processes inside them.

Started by ``Testbed.up`` in its own session, so a Ctrl-C or SIGKILL of the owner cannot leak
namespaces, links or NAT rules.
"""

from __future__ import annotations

import signal
import sys


def main(tag: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()
    from p2prl.testbed.bed import down_all

    down_all(tag)


if __name__ == "__main__":
    main(sys.argv[1])
