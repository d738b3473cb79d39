"""The node's weights in memory as values: a version's full set (:class:`Weights`), and a switch
between two versions (:class:`Switch`: the writes that take one to the other).

Weights are kept as a plain state dict (bf16 CPU tensors, tied aliases dropped). On disk they live
in ``p2prl.node.weights.disk``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from p2prl.patch import weights_sha256

State = dict[str, torch.Tensor]


@dataclass
class Weights:
    """A complete set of weights at one version, and its weights hash.

    ``hash`` is None when the weights are *unverified*: the base model as this machine builds it,
    which does not hash to the genesis'. Such weights are never a patch base nor saved; the first
    sync replaces them from an anchor."""

    version: int
    hash: str | None
    state: State
    switch: Switch | None = field(default=None, compare=False, repr=False)  # how it was reached, if by deltas

    @classmethod
    def unverified(cls, version: int, state: State) -> Weights:
        return cls(version, None, state)

    @property
    def verified(self) -> bool:
        return self.hash is not None

    @property
    def status_hash(self) -> str:
        """The hash as the status reports it (``weights_hash``): "" while unverified."""
        return "" if self.hash is None else self.hash


@dataclass(frozen=True)
class TensorWrite:
    """New values for part of one tensor: ``values`` at flat ``start + positions`` (positions None:
    ``values`` cover ``[start, start + len(values))``). ``values`` are CPU tensors of the state's dtype."""

    name: str
    start: int
    positions: torch.Tensor | None  # int64, relative to start
    values: torch.Tensor


@dataclass(frozen=True)
class Switch:
    """A version switch as a value: the writes that take weights at version ``base`` to ``version``
    (applied in order; a later write to a position wins). An engine holding its own copy of ``base``
    (on its device) applies only these, never the whole model. Dense writes' values may be views of
    the live tensors: apply a switch before the next one is made."""

    base: int
    version: int
    hash: str
    writes: tuple[TensorWrite, ...]

    @property
    def elements(self) -> int:
        return sum(int(w.values.numel()) for w in self.writes)

    def then(self, nxt: Switch) -> Switch:
        """This switch followed by ``nxt`` (which must start where this one ends)."""
        if nxt.base != self.version:
            raise ValueError(f"switch to v{nxt.version} starts at v{nxt.base}, not v{self.version}")
        return Switch(self.base, nxt.version, nxt.hash, self.writes + nxt.writes)


def sha256_of_state(state: State) -> str:
    """SHA-256 over the weights hash's byte stream (docs/PROTOCOL.md §4), for reports."""
    return weights_sha256({k: v.detach().cpu().contiguous() for k, v in state.items()})
