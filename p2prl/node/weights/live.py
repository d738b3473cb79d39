"""One copy of the weights: the node's state of the current version is patched in place.

A miner or validator on the CPU holds each version once: the state dict it verifies and patches is
made of the engine model's own tensors (tied aliases appear once), not a second copy. A version
switch first checks the patch against the live tensors without changing them (``verify_only``: the
patch decoded once, the result hashed through one reused chunk), and only a patch that produces the
hash its manifest promises is then written in place, as the changed bits its check recorded. The
check may run on the sync thread while the role generates (:meth:`LiveWeights.prepare`), so the
switch itself only writes the changed elements; it returns them as a value (``Switch``) for an
engine that holds its own copy (on CUDA) to write on its device. Per version it keeps which bits each segment changed (positions and XOR; a dense
segment's XOR whole), so a validator can step the model back to the version a batch was made at and
forward again without a copy per version.

A miner may instead switch first and hash after (``prepare(..., deferred=True)``): the signed patch
is only decoded before the switch, the switch writes it, and :meth:`LiveWeights.confirm` hashes the
live weights beside generation, stepping back to the version before if they are not what the
manifest promises. Nothing made with the new version leaves the node before that (ModelHost.settled),
so a switch costs the decode and the write, and the hash no longer delays the new version's tokens.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from p2prl.gilslices import short_gil_slices
from p2prl.node.weights.version import State, Switch, TensorWrite, Weights
from p2prl.patch import (
    PatchApplier,
    PatchError,
    PatchReason,
    SegmentChange,
    checked_blob,
    decode_anchor,
    scatter_all,
    sorted_names,
    uint_view,
    weights_hash,
)
from p2prl.protocol import PatchManifest

log = logging.getLogger(__name__)
# confirm()'s hash beside generation: the cores a CPU generation loop and one more thread leave
CONFIRM_HASH_THREADS = max(1, (os.cpu_count() or 1) - 2)
# a checked segment's int64 positions (None: a dense segment) and its new bit patterns
Values = tuple["np.ndarray | None", np.ndarray]


class LiveWeights:
    """The current version's tensors (``state``), advanced in place by verified patches.

    ``keep`` versions stay reachable by :meth:`goto` (the newest and ``keep - 1`` before it), as
    long as they were reached by deltas (an anchor resets the history). Not thread-safe: the
    role's own thread advances and steps it, between uses of the model, through its ModelHost
    (node/weights/host.py); the sync thread only checks a patch against it (:meth:`prepare`).
    """

    def __init__(self, state: State, start: Weights, keep: int = 1) -> None:
        self.state = state
        if start.state is not state:
            _copy_into(state, start.state)
        self.keep = max(1, keep)
        self.head = self.loaded = start.version
        self.hash: str | None = start.hash  # None: unverified (node/weights/version.py), never a patch base
        self._names = sorted_names(state)
        # each tensor's bits as unsigned integers, made once: a check reads them per segment
        self._uviews = {n: uint_view(t) for n, t in state.items()}
        self._hashes: dict[int, str] = {} if start.hash is None else {start.version: start.hash}
        self._steps: OrderedDict[int, list[SegmentChange]] = OrderedDict()  # v: changes v-1 -> v
        self._changed: set[str] | None = None  # names written since take_changed() (when tracked)
        # a version switched to before its result was hashed (prepare(deferred=True)): confirm() hashes
        # it, or steps back to the version before, whose hash and step stay held until then
        self.unconfirmed: int | None = None
        self._later: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []  # writes confirm() makes
        # held while the tensors are stepped or patched, and while the sync thread checks a patch
        # against them (prepare): generation only reads them, between switches
        self._lock = threading.RLock()

    def track_changes(self) -> None:
        """Keep which tensors each switch writes (an engine holding its own copy updates only those);
        until the first :meth:`take_changed`, every tensor counts as changed."""
        if self._changed is None:
            self._changed = set(self._names)

    def take_changed(self) -> set[str]:
        """The names of the tensors written since the last call (all of them when untracked)."""
        if self._changed is None:
            return set(self._names)
        out, self._changed = self._changed, set()
        return out

    @property
    def verified(self) -> bool:
        return self.hash is not None

    def weights(self, version: int | None = None) -> Weights:
        v = self.head if version is None else version
        return Weights(v, self._hashes.get(v) if v != self.head else self.hash, self.state)

    def reachable(self, version: int) -> bool:
        return self.head - len(self._steps) <= version <= self.head

    # -- switching versions ---------------------------------------------------------------
    def prepare(
        self, plan: Sequence[PatchManifest], load_blob: Callable[[str], bytes], *, deferred: bool = False
    ) -> Prepared | None:
        """Check a one-delta plan from the head against the live tensors without changing them
        (another thread may generate with them meanwhile): the patch decoded once, the result hashed.
        The :class:`Prepared` it returns lets :meth:`advance` switch by writing the changed elements
        only. None when the plan is not one delta from the head (advance then checks it itself).
        ``deferred``: decode and check the signed patch only; the result is hashed after the switch
        (:meth:`confirm`). Raises PatchError for a bad patch."""
        if len(plan) != 1 or plan[0].kind != "delta":
            return None
        m = plan[0]
        blob = checked_blob(m, load_blob)
        with self._lock:
            # never steps the tensors itself: a validator may be using an older version right now
            if self.hash is None or self.hash != m.base_hash or self.loaded != self.head:
                return None
            with short_gil_slices():  # beside a generation loop that holds the GIL
                return Prepared(m, self.head, *self._check(m, blob, hashed=not deferred), hashed=not deferred)

    def advance(
        self,
        plan: Sequence[PatchManifest],
        load_blob: Callable[[str], bytes],
        prepared: Prepared | None = None,
        *,
        write_later: bool = False,
    ) -> Weights:
        """Apply ``plan`` (from ``plan_sync``, starting at the head version or at an anchor).

        Each delta is verified before any tensor changes (``prepared``: already verified by
        :meth:`prepare` against this head); a bad one raises PatchError and leaves the state at the
        last good version. An anchor is decoded beside the state (its one full copy, held only while
        it is copied in) and checked against its hash first. The Weights returned carry the
        :class:`Switch` (the writes from the previous head) when the plan was all deltas.

        A ``prepared`` that was not hashed (``prepare(deferred=True)``) leaves the new head
        :attr:`unconfirmed` until :meth:`confirm`; ``write_later`` then also leaves these tensors'
        writes to :meth:`confirm` (an engine with its own copy, on CUDA, takes them from the Switch:
        only its write pauses generation)."""
        with self._lock, short_gil_slices():
            if self.unconfirmed is not None:
                raise PatchError(PatchReason.WRONG_BASE, f"version {self.unconfirmed} is not confirmed yet")
            self._goto(self.head)
            switch: Switch | None = None
            for i, m in enumerate(plan):
                blob = None if i == 0 and _matches(prepared, m, self) else checked_blob(m, load_blob)
                if m.kind == "anchor":
                    assert blob is not None
                    _copy_into(self.state, decode_anchor(blob, m.result_hash))
                    self._steps.clear()
                    if self._changed is not None:
                        self._changed.update(self._names)
                    step = None
                else:
                    ours = blob is None and prepared is not None
                    checked = (prepared.changes, prepared.values) if ours and prepared is not None else None
                    defer = ours and prepared is not None and not prepared.hashed
                    step = self._apply_delta(m, blob, checked, later=defer and write_later)
                    if defer and prepared is not None:  # its step is kept until confirm() hashed it
                        self.unconfirmed = m.version
                        self._steps[m.version] = prepared.changes
                if step is not None and (i == 0 or switch is not None):
                    switch = step if switch is None else switch.then(step)
                else:
                    switch = None
                self.head = self.loaded = m.version
                self.hash = self._hashes[m.version] = m.result_hash
                self._trim()
            w = self.weights()
            w.switch = switch
            return w

    def _trim(self) -> None:
        """Forget the steps and hashes past ``keep`` (and the one before an unconfirmed head, past it)."""
        keep = self.keep - 1 if self.unconfirmed is None else max(1, self.keep - 1)
        while len(self._steps) > keep:
            self._steps.popitem(last=False)
        for v in [v for v in self._hashes if not self.reachable(v)]:
            del self._hashes[v]

    def confirm(self) -> bool:
        """Hash the live weights of the :attr:`unconfirmed` head (after the writes left to now): True
        when they are what its manifest promised; else step back to the version before (its tensors,
        hash and history as they were) and return False. Runs beside generation, which only reads
        the tensors; the next switch or check waits for it. True when nothing is unconfirmed."""
        with self._lock, short_gil_slices():
            v = self.unconfirmed
            if v is None:
                return True
            later, self._later = self._later, []
            scatter_all([(dst, pos, new) for dst, pos, new in later if pos is not None])
            for dst, pos, new in later:
                if pos is None:
                    dst[: new.size] = new
            try:
                ok = weights_hash(self.state, threads=CONFIRM_HASH_THREADS) == self.hash
            except PatchError as e:  # e.g. a bool tensor holding other bytes than 0 and 1
                log.warning("version %d does not hash: %s", v, e)
                ok = False
            self.unconfirmed = None
            if not ok:
                self._put(self._steps.pop(v))  # back to the version before, bit for bit
                if self._changed is not None:  # an engine with its own copy rewrites these tensors
                    self._changed.update(self._names)
                self.head = self.loaded = v - 1
                self._hashes.pop(v, None)
                self.hash = self._hashes.get(self.head)
            self._trim()
            return ok

    def _check(self, m: PatchManifest, blob: bytes, hashed: bool = True) -> tuple[list[SegmentChange], list[Values]]:
        """Verify delta ``m`` against the live tensors (unchanged): what it changes, per segment
        (positions and XOR, for stepping back), and the new bits there. ``hashed=False``: the patch
        decoded and checked, its result not hashed (:meth:`confirm` hashes it once written)."""
        if self.hash is None or self.hash != m.base_hash:
            held = "unverified" if self.hash is None else f"{self.hash[:16]}…"
            raise PatchError(
                PatchReason.WRONG_BASE, f"version {m.version} applies to {m.base_hash[:16]}…, state is {held}"
            )
        changes: list[SegmentChange] = []
        values: list[tuple[np.ndarray | None, np.ndarray]] = []
        check = PatchApplier(
            self.state,
            base_hash=self.hash,
            verify_only=True,
            record=changes,
            values=values,
            hash_result=hashed,
            base_views=self._uviews,
        )
        check.feed(blob)
        if check.header is not None and check.header.base_hash != m.base_hash:
            raise PatchError(
                PatchReason.BAD_MANIFEST,
                f"patch of version {m.version} does not match its manifest's base hash",
            )
        check.finish()
        if check.result_hash != m.result_hash:
            raise PatchError(
                PatchReason.HASH_MISMATCH,
                f"patch of version {m.version} does not produce its manifest's result hash",
            )
        return changes, values

    def _apply_delta(
        self,
        m: PatchManifest,
        blob: bytes | None,
        checked: tuple[list[SegmentChange], list[Values]] | None,
        later: bool = False,
    ) -> Switch:
        """Write a verified delta's new bits at the positions its check recorded (the patch is decoded
        once, by the check; the old bits are not read again); returns the switch as a value.
        ``later``: leave the writes to :meth:`confirm` (the Switch carries the new bits themselves)."""
        if checked is None:
            assert blob is not None
            checked = self._check(m, blob)
        changes, values = checked
        writes, scatters = [], []
        for (ti, start, _, _), (pos, new) in zip(changes, values, strict=True):
            name = self._names[ti]
            t = self.state[name]
            v = self._uviews[name]
            signed = torch.from_numpy(new.view(np.dtype(f"i{new.dtype.itemsize}"))).view(t.dtype)
            if pos is None:
                if later:
                    self._later.append((v[start:], None, new))
                    writes.append(TensorWrite(name, start, None, signed))
                else:
                    v[start : start + new.size] = new
                    writes.append(TensorWrite(name, start, None, t.view(-1)[start : start + new.size]))
            else:  # the check's own int64 positions: nothing converted while generation waits
                (self._later if later else scatters).append((v[start:], pos, new))
                writes.append(TensorWrite(name, start, torch.from_numpy(pos), signed))
        scatter_all(scatters)  # on a few threads when large
        if self._changed is not None:
            self._changed.update(self._names[c[0]] for c in changes)
        self._steps[m.version] = changes if self.keep > 1 else []
        return Switch(self.head, m.version, m.result_hash, tuple(writes))

    def goto(self, version: int) -> None:
        """Step the tensors to ``version`` (one the history reaches) by undoing or redoing changes."""
        with self._lock:
            self._goto(version)

    def _goto(self, version: int) -> None:
        if not self.reachable(version):
            raise KeyError(f"version {version} is not held (v{self.head - len(self._steps)}..v{self.head})")
        while self.loaded > version:
            self._put(self._steps[self.loaded])
            self.loaded -= 1
        while self.loaded < version:
            self.loaded += 1
            self._put(self._steps[self.loaded])

    def _put(self, changes: list[SegmentChange]) -> None:
        """XOR each segment's changed bits back in: undoes a step, or redoes an undone one."""
        views: dict[int, np.ndarray] = {}
        for ti, start, pos, bits in changes:
            v = views.get(ti)
            if v is None:
                v = views[ti] = uint_view(self.state[self._names[ti]])
            if pos is None:
                v[start : start + bits.size] ^= bits
            else:
                v[start:][pos] ^= bits


@dataclass(frozen=True)
class Prepared:
    """A delta checked against the live tensors at version ``base`` (see LiveWeights.prepare)."""

    manifest: PatchManifest
    base: int
    changes: list[SegmentChange]
    values: list[Values]
    hashed: bool = True  # False: decoded only; the switch leaves its version unconfirmed


def _matches(prepared: Prepared | None, m: PatchManifest, live: LiveWeights) -> bool:
    """Whether ``prepared`` checked ``m`` against the weights ``live`` now holds."""
    return prepared is not None and prepared.manifest == m and prepared.base == live.head and live.hash == m.base_hash


def _copy_into(state: State, new: State) -> None:
    """Copy ``new`` into ``state``'s tensors; both must hold the same names, dtypes and shapes."""
    if set(new) != set(state):
        raise PatchError(PatchReason.WRONG_BASE, "the weights' tensor names differ from the model's")
    with torch.no_grad():
        for k, t in state.items():
            src = new[k]
            if src.dtype != t.dtype or src.shape != t.shape:
                raise PatchError(
                    PatchReason.WRONG_BASE,
                    f"{k} is {src.dtype}{list(src.shape)}, the model holds {t.dtype}{list(t.shape)}",
                )
            if src.data_ptr() != t.data_ptr():
                t.copy_(src)
