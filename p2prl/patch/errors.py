"""The one error the patch codec and chain raise on bad input: a one-line reason."""

from __future__ import annotations


class PatchError(Exception):
    """A patch, base, anchor or chain step that cannot be used; ``str(e)`` is a one-line reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(" ".join(str(reason).split()))
        self.reason = str(self)
