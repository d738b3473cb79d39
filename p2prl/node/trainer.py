"""The trainer: verified rollouts in, GRPO steps, one signed patch per published version out.

This module wires the trainer's threads, so training never waits on I/O:

- pump and fetch: the intake (``trainer_intake.RolloutIntake``): announcements and the genesis
  validators' verdicts in, the accepted groups of each released blob into the replay buffer;
- train: the learner (``trainer_learner.Learner``): GRPO steps on the buffer, the newest bf16 state
  handed to the publisher through a one-slot mailbox;
- publish: the publisher (``trainer_publisher.Publisher``): sign, store, serve, gossip, mirror,
  retain, checkpoint.

A restart resumes the chain where it stopped (the publisher's state is on disk) and the master
weights from the newest checkpoint; the version never goes backwards.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from p2prl.node.common import base_model, generation_params, publish_model_files, task_of
from p2prl.node.context import NodeContext
from p2prl.node.trainer_intake import FETCH_THREADS, RolloutIntake
from p2prl.node.trainer_learner import Learner, Mailbox
from p2prl.node.trainer_publisher import Publisher
from p2prl.patch import ChainPublisher
from p2prl.protocol import PatchManifest, RolloutAnnouncement, Verdict
from p2prl.rl import GRPOConfig, ReplayBuffer, make_learner

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        cfg = ctx.config
        self.dir = ctx.data_dir / "trainer"
        self.dir.mkdir(parents=True, exist_ok=True)
        model, self.tok, base, _ = base_model(ctx, strict=True)
        publish_model_files(ctx)
        task_of(ctx)  # rewards come from miners, but a trainer on a task it cannot build stops here
        gkw: dict[str, Any] = {"temperature": generation_params(ctx).temperature}
        if cfg.lr > 0:
            gkw["lr"] = cfg.lr
        # under torchrun: rank 0's handle on the learner sharded over all ranks (p2prl.rl.distributed)
        self.grpo = make_learner(model, GRPOConfig(**gkw), self.tok.pad_id)
        self.ckpt = self.dir / getattr(self.grpo, "checkpoint_name", "checkpoint.pt")
        patch = ctx.g.patch
        self.chain = ChainPublisher(
            self.dir / "chain",
            ctx.identity,
            ctx.network_id,
            anchor_interval=patch.anchor_interval,
            chunk_size=patch.chunk_size,
            keep_versions=cfg.keep_versions,
            store=ctx.store,
        )
        self._resume_master()
        self.paused = threading.Event()
        mailbox = Mailbox()
        # the genesis weights: published as version 0 (an anchor) by the publish thread on a fresh chain
        self.publisher = Publisher(ctx, self.chain, self.grpo, self.ckpt, mailbox, self.paused, base)
        buffer = ReplayBuffer(max_staleness=int(ctx.g.max_staleness), half_life=1.0)
        buffer_lock = threading.Lock()
        self.intake = RolloutIntake(ctx, buffer, buffer_lock, lambda: self.version)
        self.learner = Learner(
            ctx,
            self.grpo,
            buffer,
            buffer_lock,
            mailbox,
            self.paused,
            lambda: self.version,
            lambda: self.publisher.last_publish,
        )
        ctx.status.set(version=self.version, trainer_version=self.version, sync_state="training")
        self.publisher.record_head()

    @property
    def version(self) -> int:
        """The newest published version (the chain's)."""
        return self.publisher.version

    def publish(self, state: dict[str, torch.Tensor]) -> Any:
        """Publish ``state`` as the next version now (see ``Publisher.publish``)."""
        return self.publisher.publish(state)

    def _resume_master(self) -> None:
        """Master weights: the checkpoint if there is one, else the chain's last published weights."""
        if self.ckpt.exists():
            try:
                self.grpo.load(self.ckpt)
                self.ctx.status.incr("restarts_resumed")
                log.info("restored master weights and optimizer from %s", self.ckpt)
                return
            except Exception as e:
                log.warning("checkpoint %s unusable (%s); resuming from the published weights", self.ckpt, e)
        if self.chain.state is not None:
            self.grpo.load_published(self.chain.state)
            self.ctx.status.incr("restarts_resumed")

    def pause(self) -> None:
        """Stop publishing new versions (keep serving); used to let miners catch up."""
        self.paused.set()
        self.ctx.status.set(paused=True, sync_state="paused")

    def close(self) -> None:
        """Let the train and publish threads finish, then release the other ranks (under torchrun)."""
        for t in self.ctx.threads:
            if t.name in ("p2prl-train", "p2prl-publish"):
                t.join(30.0)
        close = getattr(self.grpo, "close", None)
        if close is not None:
            close()

    def holds(self) -> list[str]:
        recent = [m.blob.id for m in self.chain.manifests.all()][-PatchManifest.REANNOUNCED :]
        return [*(a.id for a in self.ctx.g.assets), *recent]

    def start(self) -> None:
        intake = self.intake
        self.ctx.spawn_pump(
            {RolloutAnnouncement.TYPE: intake.on_announcement, Verdict.TYPE: intake.on_verdict},
            self.holds,
            lambda: self.version,
        )
        for i in range(FETCH_THREADS):  # one miner that stops serving must not hold up the others
            self.ctx.spawn(f"fetch{i}", intake.run)
        self.ctx.spawn("train", self.learner.run)
        self.ctx.spawn("publish", self.publisher.run)
