"""The base of every error raised on input a peer (or a peer's file) can craft.

One shape for all of them, so every boundary handles them alike: ``reason`` is a short stable code
(a member of one of the ``p2prl.reasons`` enums, equal to its string) that goes into counters,
verdicts and logs; ``detail`` is free text for people. ``str(e)`` is ``"reason: detail"``.

It is not a ``ValueError``: subclasses whose callers catch ``ValueError`` (envelopes, messages,
batches) add it themselves, so turning an error into a peer-input error changes no ``except``.
"""

from __future__ import annotations


class PeerInputError(Exception):
    """Input that cannot be used; ``reason`` is a stable code, ``detail`` the one-line specifics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        detail = " ".join(str(detail).split())  # one line, whatever a peer put in it
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail
