"""A rich progress bar for long transfers, shared by the commands that fetch blobs or a model.

It draws on stderr, so a command's stdout (paths, JSON) stays clean for scripts; on a terminal it
redraws in place, elsewhere rich prints it once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

OnProgress = Callable[[int, int], None]


@contextmanager
def transfer_progress(description: str, total: int, console: Console | None = None) -> Iterator[OnProgress]:
    """Yield ``on_progress(done, total)`` for a transfer of ``total`` bytes; the bar completes only
    when the block ends without an exception (a failed transfer keeps the bytes it reached)."""
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=False,
    ) as bar:
        size = [max(0, total)]  # a transfer may learn its real size on the way
        task = bar.add_task(description, total=size[0])

        def on_progress(done: int, total_now: int) -> None:
            size[0] = total_now or size[0]
            bar.update(task, completed=done, total=size[0])

        yield on_progress
        bar.update(task, completed=size[0])
