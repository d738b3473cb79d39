"""Polls node status endpoints and redraws the view until interrupted."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Console
from rich.live import Live

from p2prl.dashboard.client import fetch_status
from p2prl.dashboard.view import render


def poll(urls: list[str], timeout: float = 2.0) -> list[tuple[str, dict[str, Any] | None, str]]:
    """Fetch every node's status in parallel; an unreachable node yields (url, None, error)."""

    def one(url: str) -> tuple[str, dict[str, Any] | None, str]:
        try:
            return url, fetch_status(url, timeout=timeout), ""
        except (OSError, ValueError) as e:
            return url, None, str(e)

    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as ex:
        return list(ex.map(one, urls))


def run_dashboard(
    urls: list[str] | Callable[[], list[str]],
    *,
    interval: float = 1.0,
    stop: threading.Event | None = None,
    console: Console | None = None,
) -> None:
    """Redraw every ``interval`` seconds until ``stop`` is set or Ctrl-C.

    On the main thread Ctrl-C only sets ``stop`` (read between redraws): a KeyboardInterrupt raised
    inside rich's drawing can leave its lock held, and leaving ``Live`` then waits for its refresh
    thread for good."""
    stop = stop or threading.Event()
    get_urls = urls if callable(urls) else (lambda: urls)
    console = console or Console()
    main = threading.current_thread() is threading.main_thread()
    prev = signal.signal(signal.SIGINT, lambda *_: stop.set()) if main else None
    try:
        with Live(render(poll(get_urls())), console=console, refresh_per_second=4, screen=False) as live:
            while not stop.wait(interval):
                live.update(render(poll(get_urls())))
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGINT, prev)
