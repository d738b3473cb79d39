"""The one error the patch codec and chain raise on bad input: a ``PatchReason`` and one line of detail."""

from __future__ import annotations

from p2prl.errors import PeerInputError
from p2prl.reasons import PatchReason

__all__ = ["PatchError", "PatchReason"]


class PatchError(PeerInputError):
    """A patch, base, anchor or chain step that cannot be used; ``str(e)`` is ``"reason: detail"``."""
