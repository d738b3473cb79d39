"""The trainer's learner loop: sample the replay buffer, run a GRPO step, offer the new weights.

The newest bf16 state goes to the publisher through a one-slot :class:`Mailbox`: if the publisher
is busy, a newer state replaces the waiting one, so training never waits on publishing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from p2prl.node.runtime.role import RoleEnv
from p2prl.node.setup.settings import TrainerSettings
from p2prl.rl import PolicyLearner, ReplayBuffer, RolloutGroup

T = TypeVar("T")
State = dict[str, torch.Tensor]


class Mailbox(Generic[T]):
    """A one-slot handoff where a newer item replaces an older one not yet taken."""

    def __init__(self) -> None:
        self._item: T | None = None
        self._cond = threading.Condition()

    def put(self, item: T) -> None:
        with self._cond:
            self._item = item
            self._cond.notify_all()

    def take(self, timeout: float) -> T | None:
        with self._cond:
            if self._item is None:
                self._cond.wait(timeout)
            item, self._item = self._item, None
            return item

    @property
    def empty(self) -> bool:
        with self._cond:
            return self._item is None


class Learner:
    """The train thread (``run``). ``version`` is the published version the buffer is sampled at;
    ``published_at`` the monotonic time of the last publish (``min_publish_s`` counts from it)."""

    def __init__(
        self,
        env: RoleEnv[TrainerSettings],
        grpo: PolicyLearner,
        buffer: ReplayBuffer,
        buffer_lock: threading.Lock,
        mailbox: Mailbox[State],
        paused: threading.Event,
        version: Callable[[], int],
        published_at: Callable[[], float],
        bar: Callable[[str, str], None] | None = None,
    ) -> None:
        self.env = env
        self.grpo = grpo
        self.buffer = buffer
        self.buffer_lock = buffer_lock
        self.mailbox = mailbox
        self.paused = paused
        self.version = version
        self.published_at = published_at
        self.bar = bar  # (miner key hex, why): a key whose rollout the step's token check rejected
        self.batch_groups = env.settings.train_batch_groups or env.g.generation.groups_per_batch
        env.status.set(train_batch_groups=self.batch_groups, stepping=False)
        self.steps = 0
        self._unpublished = False  # trained steps not yet handed to the publisher

    def run(self) -> None:
        env = self.env
        cfg = env.settings
        while not env.stop.is_set():
            version = self.version()
            if self.paused.is_set() or (cfg.max_versions and version >= cfg.max_versions):
                env.stop.wait(0.5)
                continue
            with self.buffer_lock:
                self.buffer.evict(version)
                size = len(self.buffer)
                groups = self.buffer.sample(version, self.batch_groups) if size >= self.batch_groups else []
            env.status.set(buffer_groups=size)
            if not groups:
                self._offer_state()  # a step held back by min_publish_s must not wait for new data
                env.stop.wait(0.05 if self._unpublished else 0.2)
                continue
            for _ in range(cfg.train_epochs):
                if env.stop.is_set() or not self._train_step(groups):
                    break

    def _train_step(self, groups: list[RolloutGroup]) -> bool:
        """One GRPO step on ``groups``; hands the new state to the publisher. False: nothing learned."""
        env = self.env
        t0 = time.monotonic()
        version = self.version()
        for g in groups:  # how far the policy has moved since: the token check's margin grows with it
            g.extra["staleness"] = max(0, version - g.version)
        env.status.set(stepping=True)  # a run that ends mid-step says so (a pretrained model's step is slow)
        try:
            stats = self.grpo.step(groups)
        finally:
            env.status.set(stepping=False)
        self._report_rejected()
        self.steps += 1
        env.status.incr("train_steps")
        env.status.gauge("train_step_ms", (time.monotonic() - t0) * 1000)
        for k in ("loss", "clip_frac", "kl", "grad_norm", "reward_mean"):
            if isinstance(stats.get(k), (int, float)):
                env.status.gauge(f"train_{k}", float(stats[k]))
        if stats.get("skipped"):
            env.status.incr("train_steps_skipped")  # no group had reward variance: nothing learned
            return False
        self._unpublished = True
        self._offer_state()
        return True

    def _report_rejected(self) -> None:
        """Rollouts the step left out because their tokens did not follow their public uniforms: a
        proof of lying nobody else recomputed, so the key is barred as a validator's veto bars it."""
        rejected = getattr(self.grpo, "rejected", None) or []
        if rejected:
            self.env.status.incr("rollouts_unverified", len(rejected))
        if self.bar is not None:
            for miner in sorted({r.miner for r in rejected}):
                self.bar(miner, "unverified_tokens")

    def _offer_state(self) -> None:
        """Hand the newest trained state to the publisher if it is free and min_publish_s has passed."""
        if not self._unpublished or not self.mailbox.empty:
            return
        if time.monotonic() - self.published_at() < self.env.settings.min_publish_s:
            return
        self._unpublished = False
        self.mailbox.put(self.grpo.published_state())
