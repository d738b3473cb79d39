"""The trainer: verified rollouts in, GRPO steps, one signed patch per published version out.

This module wires the trainer's threads, so training never waits on I/O:

- pump, receipts and fetch: the intake (``intake.RolloutIntake``): announcements and the genesis
  validators' verdicts in, a signed receipts list of the announcements every second, the accepted
  groups of each released chained blob into the replay buffer;
- train: the learner (``learner.Learner``): GRPO steps on the buffer, the newest bf16 state
  handed to the publisher through a one-slot mailbox;
- publish: the publisher (``publisher.Publisher``): sign, store, serve, gossip, mirror,
  retain, checkpoint.

A restart resumes the chain where it stopped (the publisher's state is on disk) and the master
weights from the newest checkpoint; the version never goes backwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

import torch

from p2prl.node.runtime.pump import Handlers
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.runtime.task import generation_params, task_of
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.intake import FETCH_THREADS, RolloutIntake
from p2prl.node.trainer.learner import Learner, Mailbox, State
from p2prl.node.trainer.publisher import Publisher
from p2prl.node.weights.start import base_model, publish_model_files
from p2prl.patch import ChainPublisher, PublishedVersion
from p2prl.protocol import PatchManifest, RolloutAnnouncement, Verdict
from p2prl.rl import GRPOConfig, ReplayBuffer, make_learner

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, env: RoleEnv[TrainerSettings]) -> None:
        self.env = env
        cfg = env.settings
        self.dir = env.data_dir / "trainer"
        self.dir.mkdir(parents=True, exist_ok=True)
        model, self.tok, base, _ = base_model(env, strict=True)
        publish_model_files(env)
        task_of(env)  # rewards come from miners, but a trainer on a task it cannot build stops here
        gen = generation_params(env)
        grpo_cfg = GRPOConfig(temperature=gen.temperature, top_p=gen.top_p)
        if cfg.lr > 0:  # 0: the RL default
            grpo_cfg = replace(grpo_cfg, lr=cfg.lr)
        # under torchrun: rank 0's handle on the learner sharded over all ranks (p2prl.rl.distributed)
        self.grpo = make_learner(model, grpo_cfg, self.tok.pad_id)
        self.ckpt = self.dir / self.grpo.checkpoint_name
        patch = env.g.patch
        self.chain = ChainPublisher(
            self.dir / "chain",
            env.identity,
            env.network_id,
            anchor_interval=patch.anchor_interval,
            chunk_size=patch.chunk_size,
            keep_versions=cfg.keep_versions,
            store=env.store,
        )
        self._resume_master()
        self.paused = threading.Event()
        mailbox: Mailbox[State] = Mailbox()
        # the genesis weights: published as version 0 (an anchor) by the publish thread on a fresh chain
        self.publisher = Publisher(env, self.chain, self.grpo, self.ckpt, mailbox, self.paused, base)
        buffer = ReplayBuffer(max_staleness=int(env.g.max_staleness), half_life=1.0)
        buffer_lock = threading.Lock()
        self.intake = RolloutIntake(env, buffer, buffer_lock, lambda: self.version)
        self.learner = Learner(
            env,
            self.grpo,
            buffer,
            buffer_lock,
            mailbox,
            self.paused,
            lambda: self.version,
            lambda: self.publisher.last_publish,
            self.intake.bar,
        )
        env.status.set(version=self.version, trainer_version=self.version, sync_state="training")
        self.publisher.record_head()

    @property
    def version(self) -> int:
        """The newest published version (the chain's)."""
        return self.publisher.version

    def publish(self, state: dict[str, torch.Tensor]) -> PublishedVersion:
        """Publish ``state`` as the next version now (see ``Publisher.publish``)."""
        return self.publisher.publish(state)

    def _resume_master(self) -> None:
        """Master weights: the checkpoint if there is one, else the chain's last published weights."""
        if self.ckpt.exists():
            try:
                self.grpo.load(self.ckpt)
                self.env.status.incr("restarts_resumed")
                log.info("restored master weights and optimizer from %s", self.ckpt)
                return
            except Exception as e:
                log.warning("checkpoint %s unusable (%s); resuming from the published weights", self.ckpt, e)
        if self.chain.state is not None:
            self.grpo.load_published(self.chain.state)
            self.env.status.incr("restarts_resumed")

    def pause(self) -> None:
        """Stop publishing new versions (keep serving); used to let miners catch up."""
        self.paused.set()
        self.env.status.set(paused=True, sync_state="paused")

    def close(self) -> None:
        """Release the other ranks (under torchrun), once the train and publish loops are done."""
        self.grpo.close()

    def holds(self) -> list[str]:
        recent = [m.blob.id for m in self.chain.manifests.all()][-PatchManifest.REANNOUNCED :]
        return [*(a.id for a in self.env.g.assets), *recent]

    def head(self) -> int:
        return self.version

    def handlers(self) -> Handlers:
        return Handlers().on(RolloutAnnouncement, self.intake.on_announcement).on(Verdict, self.intake.on_verdict)

    def loops(self) -> dict[str, Callable[[], None]]:
        # fetchers: one miner that stops serving must not hold up the others
        fetchers = {f"fetch{i}": self.intake.run for i in range(FETCH_THREADS)}
        return {**fetchers, "receipts": self.intake.send_receipts, "train": self.learner.run, "publish": self.publisher.run}
