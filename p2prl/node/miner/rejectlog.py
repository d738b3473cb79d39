"""A miner's log of its own rejected groups: one line per reason a minute, with what to do about it.

Without it a miner whose every batch is rejected (unreachable on a LAN without ``--local-network``,
a gap after a restart) shows only counters in ``/status`` and a silent log.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable

from p2prl.reasons import HARD_FAILURES, VerdictReason

log = logging.getLogger("p2prl.node.miner.miner")

HINTS: dict[str, str] = {
    VerdictReason.UNREACHABLE: "no validator could fetch this node's rollouts: on one machine or a LAN, "
    "start every node with --local-network; otherwise check that this node's listen port is reachable",
    VerdictReason.STALE: "this node is behind the trainer: rollouts of old versions are dropped",
    VerdictReason.INDEX_GAP: "the validator did not judge this node's earlier batches of this version (lost, "
    "or unreachable before): it takes them again from the next version, or once it restarts",
}
# the same rejection when this node already runs with --local-network: the flag is not what is missing
HINTS_LOCAL: dict[str, str] = {
    VerdictReason.UNREACHABLE: "the validator could not fetch this node's rollouts in time although this node "
    "runs with --local-network: on a loaded machine the validator or this node was too slow to serve them "
    "(check the load), or the validator was started without --local-network",
}
EVERY_S = 60.0
KNOWN = frozenset(VerdictReason)


class RejectionLog:
    """Logs rejected groups by reason, each reason at most once per ``every_s`` seconds."""

    def __init__(self, every_s: float = EVERY_S, local_network: bool = False) -> None:
        self.every_s = every_s
        self.hints = {**HINTS, **HINTS_LOCAL} if local_network else HINTS
        self._last: dict[str, float] = {}
        self._pending: Counter[str] = Counter()

    def add(self, version: int, reasons: Iterable[str], now: float | None = None) -> list[str]:
        """Count a verdict's rejected groups (``reasons``); returns the lines logged now."""
        now = time.monotonic() if now is None else now
        # a verdict carries any short code: unknown ones share one entry, so the tables stay bounded
        self._pending.update(r if r in KNOWN else "other" for r in reasons if r != VerdictReason.OK)
        lines = []
        for reason, n in list(self._pending.items()):
            if now - self._last.get(reason, -self.every_s) < self.every_s:
                continue
            self._last[reason] = now
            del self._pending[reason]
            hint = self.hints.get(reason, "")
            line = f"{n} group(s) rejected as {reason} (v{version})" + (f": {hint}" if hint else "")
            (log.error if reason in HARD_FAILURES else log.warning)("%s", line)
            lines.append(line)
        return lines
