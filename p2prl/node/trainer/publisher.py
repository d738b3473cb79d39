"""The trainer's publisher loop: one signed patch (or anchor) per published version.

For each state the learner hands over it encodes the patch, signs the manifest, stores and serves
the blob, gossips the manifest, mirrors to S3, applies retention and checkpoints the master
weights; between publishes it re-sends the newest manifests now and then (gossip is lossy).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import torch

from p2prl.node.runtime.role import RoleEnv
from p2prl.node.setup.settings import TrainerSettings
from p2prl.node.trainer.learner import Mailbox, State
from p2prl.node.weights.version import sha256_of_state
from p2prl.patch import ChainPublisher, PublishedVersion, weights_hash
from p2prl.protocol import PatchManifest
from p2prl.rl import PolicyLearner

log = logging.getLogger(__name__)

REANNOUNCE_S = 10.0


class Publisher:
    """The publish thread (``run``). ``chain`` is the ChainPublisher (its version is the trainer's),
    ``base`` the genesis weights, published as version 0 (an anchor) on a fresh chain."""

    def __init__(
        self,
        env: RoleEnv[TrainerSettings],
        chain: ChainPublisher,
        grpo: PolicyLearner,
        checkpoint: Path,
        mailbox: Mailbox[State],
        paused: threading.Event,
        base: dict[str, torch.Tensor] | None,
    ) -> None:
        self.env = env
        self.chain = chain
        self.grpo = grpo
        self.checkpoint = checkpoint
        self.mailbox = mailbox
        self.paused = paused
        self._base = base
        self.version = chain.version if chain.version is not None else 0
        self.last_publish = 0.0
        self._last_reannounce = 0.0
        self._sha_lock = threading.Lock()

    def run(self) -> None:
        env = self.env
        if self.chain.version is None:
            self.publish(self._base)  # version 0: the genesis base model, as an anchor
        self._base = None
        while not env.stop.is_set():
            state = self.mailbox.take(timeout=0.5)
            if state is None:
                self._maybe_reannounce()
                continue
            if self.paused.is_set():
                continue
            self.publish(state)

    def publish(self, state: dict[str, torch.Tensor]) -> PublishedVersion:
        """Publish ``state`` as the next version: sign, store, serve, gossip, mirror, retain, checkpoint."""
        env = self.env
        t0 = time.monotonic()
        pv = self.chain.publish(state)
        env.status.gauge("patch_encode_ms", self.chain.last_encode_s * 1000)  # set before the version
        for item in pv.items:  # the chain stored and pinned the blobs in our store
            env.net.serve(item.manifest.blob)
            env.publish_raw("manifests", item.envelope)
        m = pv.manifest
        self.last_publish = time.monotonic()
        self.version = m.version
        env.status.set(version=m.version, trainer_version=m.version, weights_hash=m.result_hash)
        env.status.record_hash(m.version, m.result_hash)
        self.record_sha(m.version, state)
        env.status.incr("versions_published")
        env.status.incr("patch_bytes_total", m.blob.size)
        env.status.gauge("patch_last_bytes", m.blob.size)
        env.status.gauge("publish_ms", (time.monotonic() - t0) * 1000)
        self._retention()
        for item in pv.items:
            self._mirror(m.version, item.envelope, item.manifest.blob.id, item.blob)
        if m.version % max(1, env.settings.checkpoint_every) == 0:
            self.grpo.save(self.checkpoint)
        log.info("published v%d (%s, %d bytes)", m.version, m.kind, m.blob.size)
        return pv

    def record_head(self) -> None:
        """Put the chain's head (a restarted trainer's) into the status."""
        head = self.chain.state
        if head is not None:
            self.env.status.set(weights_hash=weights_hash(head))
            self.env.status.record_hash(self.version, weights_hash(head))
            self.record_sha(self.version, head)

    def record_sha(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Each version's full-model SHA-256 for run summaries, only when asked (one hash of the model)."""
        if not self.env.settings.report_weights_sha256:
            return
        sha = sha256_of_state(state)
        self.env.status.set(weights_sha256=sha)
        with self._sha_lock:
            shas = dict(self.env.status.get("sha256_by_version") or {})
            shas[str(version)] = sha
            for k in sorted(shas, key=int)[:-64]:
                del shas[k]
        self.env.status.set(sha256_by_version=shas)

    def _retention(self) -> None:
        dropped = self.chain.prune()
        if dropped:
            self.env.status.incr("blobs_retired", len(dropped))

    def _mirror(self, version: int, envelope: bytes, blob_id: str, blob: bytes) -> None:
        s3 = self.env.net.s3
        if s3 is None:
            return
        try:
            s3.publish_version(version, envelope, {blob_id: blob})
            self.env.status.incr("s3_versions_mirrored")
        except Exception as e:  # S3 is a fallback: an outage must not stop training
            self.env.status.incr_label("s3_errors", type(e).__name__)
            log.warning("S3 mirror of v%d failed: %s", version, e)

    def _maybe_reannounce(self) -> None:
        """Gossip is lossy: re-send the newest manifests now and then (peers drop duplicates)."""
        now = time.monotonic()
        if now - self._last_reannounce < REANNOUNCE_S:
            return
        self._last_reannounce = now
        for env in self.recent_envelopes():
            self.env.publish_raw("manifests", env)

    def recent_envelopes(self) -> list[bytes]:
        """The newest anchor's manifest and every manifest after it: all a late joiner needs."""
        manifests = self.chain.manifests
        anchors = [m.version for m in manifests.all() if m.kind == "anchor"]
        return manifests.envelopes(since=max(anchors, default=0))[-PatchManifest.REANNOUNCED :]
