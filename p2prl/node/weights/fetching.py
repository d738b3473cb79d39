"""A weights blob fetched for as long as it keeps arriving, with progress a person can see.

``fetch_timeout_s`` bounds one fetch call, so on a slow link a joining node's first anchor (the whole
model) outlasts it: the sync loop used to log "sync … failed" at 60 s while the chunks were still
coming, back off and start again. Here a call that times out after bytes arrived is simply called
again (the network layer keeps the partial download, so it resumes); only a call in which nothing
arrived fails. Large blobs show a progress bar on a terminal (stderr) and, without one, an INFO line
every ``LOG_EVERY_S``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

from p2prl.node.runtime.port import RolePort
from p2prl.protocol import BlobRef

log = logging.getLogger(__name__)

BAR_MIN_BYTES = 16 * 1024 * 1024  # smaller blobs come in a few seconds: no bar, no progress lines
LOG_EVERY_S = 10.0


def fetch_while_progressing(
    net: RolePort,
    ref: BlobRef,
    timeout: float,
    label: str,
    on_progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """``net.fetch(ref)`` again after each timeout in which bytes arrived; raises the last error of a
    call in which none did (or once ``stop`` is set)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    seen = [0]
    big = ref.size >= BAR_MIN_BYTES
    last_log = [time.monotonic()]
    with Progress(
        label, BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        disable=not (big and sys.stderr.isatty()), transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task(label, total=ref.size)

        def progress(done: int, total: int) -> None:
            seen[0] = max(seen[0], done)
            bar.update(task, completed=done)
            if on_progress is not None:
                on_progress(done, total)
            now = time.monotonic()
            if big and now - last_log[0] >= LOG_EVERY_S:
                last_log[0] = now
                log.info("%s: %.0f%% of %d MB", label, 100 * done / max(1, total), total >> 20)

        while True:
            before = seen[0]
            try:
                net.fetch(ref, timeout=timeout, on_progress=progress)
                return
            except Exception as e:
                if seen[0] <= before or (stop is not None and stop.is_set()):
                    raise
                log.info(
                    "%s: %d of %d bytes after %.0f s, still arriving: fetching on (%s)",
                    label, seen[0], ref.size, timeout, e,
                )  # fmt: skip
