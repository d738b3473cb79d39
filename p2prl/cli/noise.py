"""Messages from dependencies that look like failures in a healthy run, dropped where logging is set up.

transformers 5.x announces, once per process, that ``past_key_values`` is deprecated (a logger
warning and a FutureWarning): the generation engine's call, not the user's, and nothing a user can
act on. Only these exact messages are dropped; any other warning still shows.
"""

from __future__ import annotations

import logging
import re
import warnings

# (warning category, message regex) pairs for warnings.filterwarnings (matched at the message's start)
WARNINGS: tuple[tuple[type[Warning], str], ...] = ((FutureWarning, r"`past_key_values` is deprecated"),)
# logger name -> message regexes (a logger's own filters see what is logged on it)
LOG_MESSAGES: dict[str, tuple[str, ...]] = {
    "transformers.utils.generic": (r"`past_key_values`/`cache_params` are deprecated",),
}


class _DropMatching(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(p.search(msg) for p in self.patterns)


def quiet_dependencies() -> None:
    """Install the filters (idempotent enough: a repeated call adds equal filters)."""
    for category, pattern in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, patterns in LOG_MESSAGES.items():
        logging.getLogger(name).addFilter(_DropMatching(patterns))
