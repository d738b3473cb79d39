"""The one owner of the weights a miner or validator runs.

:class:`ModelHost` holds the live tensors (:class:`LiveWeights`: one copy, patched in place, the
last few versions reachable by stepping back), the engine that generates or judges with them, the
version the role runs, the versions staged for it and the saved copy on disk. The role asks it for
the current version; nothing else keeps one.

Who writes what, on which thread:

- the sync thread (``p2prl.node.weights.sync``) plans and fetches; it hands the host each version
  whose blobs are all held as a :class:`Staged` value (:meth:`ModelHost.stage`), having checked a
  one-delta plan against the live tensors without changing them (:meth:`ModelHost.prepare`);
- the role's own thread, between uses of the model, is the only writer of the tensors and the
  engine: :meth:`ModelHost.switch` applies the staged plans (each patch verified before any tensor
  changes), saves the newest version (at most every ``SAVE_EVERY_S``; :meth:`ModelHost.close` saves
  the last), sets it current and, for a miner, writes the switch into the
  engine; a validator's :meth:`ModelHost.source` steps the tensors to the version a batch was made
  at and loads the engine with it;
- a miner (``follow``) switches to a one-delta version once its signed patch is decoded, before its
  result is hashed: the host's confirm thread hashes the live weights beside generation
  (``LiveWeights.confirm``), and :meth:`ModelHost.settled` holds back whatever was made with the
  version until then (a version that does not hash is stepped back, its work dropped);
- any thread reads the current version (:attr:`ModelHost.current`) under the host's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from p2prl.lru import LRU
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.setup.settings import RoleSettings
from p2prl.node.weights.disk import save_weights
from p2prl.node.weights.live import LiveWeights, Prepared
from p2prl.node.weights.version import State, Weights, sha256_of_state
from p2prl.patch import PatchError, PatchReason
from p2prl.protocol import PatchManifest

if TYPE_CHECKING:
    import torch

    from p2prl.rl import RolloutEngine

log = logging.getLogger(__name__)

Switched = Callable[[list[Weights], Exception | None], None]


@dataclass(frozen=True)
class Staged:
    """A version whose blobs are all held: the plan to it from the version before (``plan_sync``'s,
    from that version or from an anchor) and, for one delta from the live version, its check
    against the live tensors (``prepared``), so the switch only writes."""

    version: int
    hash: str
    plan: Sequence[PatchManifest]
    prepared: Prepared | None = None

    @property
    def weights(self) -> Weights:
        """The version it promises: its manifest's result hash, no tensors yet."""
        return Weights(self.version, self.hash, {})


def _shares(model: torch.nn.Module, state: State) -> bool:
    """Whether ``state`` is made of the model's own tensors (one copy: nothing to write after a switch)."""
    own = model.state_dict()
    return all(n in own and own[n].data_ptr() == t.data_ptr() for n, t in state.items())


# The newest version is written to disk at most this often (and when the role closes): a save writes
# and fsyncs the whole model, which at every switch held a 0.5B model's generation for seconds.
SAVE_EVERY_S = 30.0


class ModelHost:
    """The live tensors, the engine, the current and staged versions, the versions a validator can
    load again, the saved copy; see the module docstring for who calls what on which thread.

    ``follow``: the engine runs the newest version, written into it at each switch (a miner);
    otherwise it is loaded with the version asked for, on demand (:meth:`source`, a validator).
    ``engine_state``: the weights the engine runs for a version (its own, unless a benchmark's
    adversary perturbs them)."""

    def __init__(
        self,
        env: RoleEnv[RoleSettings],
        live: LiveWeights,
        engine: RolloutEngine,
        weights_dir: Path,
        *,
        follow: bool,
        engine_state: Callable[[Weights], State] | None = None,
    ) -> None:
        self.env = env
        self.live = live
        self.engine = engine
        self.weights_dir = Path(weights_dir)
        self.follow = follow
        self.engine_state = engine_state or (lambda w: w.state)
        self._lock = threading.Lock()
        start = live.weights()
        self._current = start
        self._switching: Weights | None = None  # the newest version being applied
        self._staged: list[Staged] = []
        self._versions: LRU[int, Weights] = LRU(live.keep)  # what source() loads
        self._versions[start.version] = start
        self._engine_version: int | None = None  # loaded in the engine (None: nothing, or the tensors moved)
        self._switched: Switched | None = None
        self._saved: tuple[int, float] | None = None  # (version, monotonic time) of the last save
        # a miner hashes a version after switching to it, on this thread, beside generation
        self._confirm_pool = ThreadPoolExecutor(1, thread_name_prefix="p2prl-confirm") if follow else None
        self._confirming: tuple[Future[bool], float] | None = None  # (the hash, when it was asked for)
        # the engine keeps its own copy, written from each switch's values (CUDA): the live tensors'
        # own writes can wait for the confirm thread
        self._write_later = bool(
            follow
            and engine_state is None
            and getattr(engine, "write_changes", None) is not None
            and not _shares(engine.model, live.state)
        )
        env.status.set(version=start.version, weights_hash=start.status_hash)
        if follow:
            self._load_engine(start)
        self._report_sha(start)

    # -- any thread ---------------------------------------------------------------------
    @property
    def current(self) -> Weights:
        """The version the role runs (the newest switched to)."""
        with self._lock:
            return self._current

    def base(self) -> Weights:
        """The version the next plan starts from: the newest staged, else the one being switched to,
        else the current one (no tensors for the first two)."""
        with self._lock:
            return self._staged[-1].weights if self._staged else self._switching or self._current

    def has_staged(self) -> bool:
        with self._lock:
            return bool(self._staged)

    # -- the sync thread ----------------------------------------------------------------
    def listen(self, switched: Switched) -> None:
        """Call ``switched(reached, error)`` on the role's thread after each switch (the sync's
        accounting: a failed switch sends the next sync through an anchor)."""
        self._switched = switched

    def prepare(self, plan: Sequence[PatchManifest], load_blob: Callable[[str], bytes]) -> Prepared | None:
        """Check a one-delta plan against the live tensors without changing them (LiveWeights.prepare;
        a miner's is decoded only: its result is hashed after the switch)."""
        return self.live.prepare(plan, load_blob, deferred=self.follow)

    def stage(self, staged: Staged) -> None:
        """A fetched version for the role to switch to; each starts where the previous one ends."""
        with self._lock:
            self._staged.append(staged)

    # -- the role's thread --------------------------------------------------------------
    def switch(self) -> list[Weights]:
        """Switch to every version staged since the last call, oldest first, in place, up to the
        first bad patch; returns the versions reached (the newest is now current and saved)."""
        self.settle()  # the version before must be confirmed (or stepped back) first
        with self._lock:
            staged, self._staged = self._staged, []
            if staged:  # the sync thread plans on from it while this applies
                self._switching = staged[-1].weights
        if not staged:
            return []
        done, error = self._apply(staged)
        if done:
            self.env.status.set(version=done[-1].version, weights_hash=done[-1].status_hash)
            if self.follow:
                self._load_engine(_composed(done))
            if self.live.unconfirmed is None:
                self._report_sha(done[-1])
            elif self._confirm_pool is not None:
                self._confirming = (self._confirm_pool.submit(self.live.confirm), time.monotonic())
        if self._switched is not None and (done or error is not None):
            self._switched(done, error)
        return done

    def settle(self) -> bool:
        """On the role's thread: wait for the hash of a version switched to before it was hashed.
        False when it was not what its manifest promised: the tensors, the engine and the current
        version are then back at the version before, and the sync goes through an anchor."""
        pending, self._confirming = self._confirming, None
        if pending is None:
            return True
        ok = pending[0].result()
        st = self.env.status
        st.gauge("patch_confirm_ms", (time.monotonic() - pending[1]) * 1000)
        if ok:
            w = self.current
            self._save(w, every_s=SAVE_EVERY_S)
            self._report_sha(w)
            return True
        with self._lock:
            bad, self._current = self._current, self.live.weights()
            self._versions.pop(bad.version, None)
            back = self._versions[self._current.version] = self._current
        st.set(version=back.version, weights_hash=back.status_hash)
        log.warning("v%d does not hash to its manifest's result hash: back at v%d", bad.version, back.version)
        if self.follow:
            self._engine_version = None
            self._load_engine(back)  # the whole state: the engine's copy held the bad version
        if self._switched is not None:
            self._switched([], PatchError(PatchReason.HASH_MISMATCH, f"v{bad.version} does not produce its result hash"))
        return False

    def settled(self, w: Weights) -> bool:
        """Whether what was made with ``w`` may leave the node: its version confirmed (after waiting
        for the hash in flight), not stepped back."""
        self.settle()
        with self._lock:
            held = self._versions.get(w.version)
        return held is not None and held.hash == w.hash and held.verified

    def _apply(self, staged: list[Staged]) -> tuple[list[Weights], Exception | None]:
        """Verify and apply the plans, oldest first, up to the first bad one; saves the newest reached."""
        st, done, error = self.env.status, [], None
        for s in staged:
            t0 = time.monotonic()
            try:
                pending = self.live.unconfirmed  # an earlier one of these, switched to before its hash
                if pending is not None and not self.live.confirm():
                    raise PatchError(PatchReason.HASH_MISMATCH, f"v{pending} does not produce its result hash")
                # the live copy's writes wait for the confirm thread only where the engine takes them
                # from this switch (it runs the version before); a whole load would read the live copy
                later = self._write_later and self._engine_version == self.live.head
                done.append(self.live.advance(s.plan, self.env.store.get, s.prepared, write_later=later))
            except PatchError as e:
                log.warning("switch to v%d failed: %s", s.version, e)
                error = e
                break
            st.incr("patches_applied", len(s.plan))
            st.incr("patch_bytes_total", sum(m.blob.size for m in s.plan))
            st.gauge("patch_last_bytes", s.plan[-1].blob.size)
            st.gauge("patch_apply_ms", (time.monotonic() - t0) * 1000)
        if error is not None and done and done[-1].version != self.live.head:  # stepped back by confirm()
            done.pop()
        with self._lock:
            self._current, self._switching = self.live.weights(), None
            for w in done:
                self._versions[w.version] = w
        if done and self.live.unconfirmed is None:  # an unconfirmed one is saved once settled
            self._save(done[-1], every_s=SAVE_EVERY_S)
        return done, error

    def _save(self, w: Weights, every_s: float = 0.0) -> None:
        """Save ``w`` (the live tensors at its version) unless it is saved, or the last save is less
        than ``every_s`` old: a restart resumes from it and re-applies the patches its store holds."""
        now = time.monotonic()
        last = self._saved
        if w.hash is None or (last is not None and (last[0] == w.version or now - last[1] < every_s)):
            return
        save_weights(w, self.weights_dir)
        self._saved = (w.version, now)
        self.env.status.gauge("weights_save_ms", (time.monotonic() - now) * 1000)

    def close(self) -> None:
        """On the role's thread, once its loops stopped: save the newest version if it is not."""
        with self._lock:
            self._staged = []
        self.settle()
        if self._confirm_pool is not None:
            self._confirm_pool.shutdown(wait=True)
        self.live.goto(self.live.head)  # a validator may have stepped the tensors back
        self._save(self.live.weights())

    def can_load(self, version: int) -> bool:
        """Whether :meth:`source` would load ``version`` now: held, verified, its tensors reachable
        (syncing through an anchor resets the versions the live tensors can step back to)."""
        with self._lock:
            w = self._versions.get(version)
        return w is not None and w.verified and (w.state is not self.live.state or self.live.reachable(version))

    def source(self, version: int) -> tuple[str, torch.nn.Module] | None:
        """The RolloutValidator's VersionSource: (manifest hash, model) with that version loaded;
        None for a version not held (or unverified)."""
        with self._lock:
            w = self._versions.get(version)
        if w is None or not w.verified:
            return None
        if w.state is self.live.state:
            if not self.live.reachable(version):
                return None
            self.live.goto(version)
            # the live tensors moved; the engine loads them (on the CPU: they are its own)
            self._engine_version = None
        if self._engine_version != version:
            self.engine.load_state_dict(w.state)
            self._engine_version = version
        return w.hash, self.engine.model

    def _load_engine(self, w: Weights) -> None:
        """Make the engine run ``w``: only the switch's writes where the engine keeps its own copy of
        the version before (CUDA), nothing where its model is the live tensors, else the whole state."""
        state = self.engine_state(w)
        write = getattr(self.engine, "write_changes", None)
        sw = w.switch
        if write is not None and sw is not None and state is w.state and sw.base == self._engine_version:
            if not _shares(self.engine.model, state):  # the live tensors are not the engine's own (CUDA)
                # the switch as a value: only the changed elements, written where the engine keeps them
                self.env.status.gauge(
                    "engine_write_bytes", write((x.name, x.start, x.positions, x.values) for x in sw.writes)
                )
        else:
            self.engine.load_state_dict(state)
        self._engine_version = w.version

    def _report_sha(self, w: Weights) -> None:
        """The full-model SHA-256 for run summaries, only when asked (one hash of the model)."""
        if self.env.settings.report_weights_sha256:
            self.env.status.set(weights_sha256=sha256_of_state(w.state))


def _composed(done: list[Weights]) -> Weights:
    """The newest of ``done`` with one switch from the version before the first: the writes of each in
    turn (None where one was reached through an anchor)."""
    switch = done[0].switch
    for w in done[1:]:
        switch = None if switch is None or w.switch is None else switch.then(w.switch)
    return Weights(done[-1].version, done[-1].hash, done[-1].state, switch)
