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
from typing import Any

import torch

from p2prl.node.context import NodeContext
from p2prl.node.trainer_learner import Mailbox
from p2prl.node.weights import sha256_of_state
from p2prl.patch import weights_hash
from p2prl.protocol import PatchManifest

log = logging.getLogger(__name__)

REANNOUNCE_S = 10.0


class Publisher:
    """The publish thread (``run``). ``chain`` is the ChainPublisher (its version is the trainer's),
    ``base`` the genesis weights, published as version 0 (an anchor) on a fresh chain."""

    def __init__(
        self,
        ctx: NodeContext,
        chain: Any,
        grpo: Any,
        checkpoint: Path,
        mailbox: Mailbox,
        paused: threading.Event,
        base: dict[str, torch.Tensor] | None,
    ) -> None:
        self.ctx = ctx
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
        ctx = self.ctx
        if self.chain.version is None:
            self.publish(self._base)  # version 0: the genesis base model, as an anchor
        self._base = None
        while not ctx.stop.is_set():
            state = self.mailbox.take(timeout=0.5)
            if state is None:
                self._maybe_reannounce()
                continue
            if self.paused.is_set():
                continue
            self.publish(state)

    def publish(self, state: dict[str, torch.Tensor]) -> Any:
        """Publish ``state`` as the next version: sign, store, serve, gossip, mirror, retain, checkpoint."""
        ctx = self.ctx
        t0 = time.monotonic()
        pv = self.chain.publish(state)
        ctx.status.gauge("patch_encode_ms", self.chain.last_encode_s * 1000)  # set before the version
        for item in pv.items:  # the chain stored and pinned the blobs in our store
            ctx.net.serve(item.manifest.blob)
            ctx.publish_raw("manifests", item.envelope)
        m = pv.manifest
        self.last_publish = time.monotonic()
        self.version = m.version
        ctx.status.set(version=m.version, trainer_version=m.version, weights_hash=m.result_hash)
        ctx.status.record_hash(m.version, m.result_hash)
        self.record_sha(m.version, state)
        ctx.status.incr("versions_published")
        ctx.status.incr("patch_bytes_total", m.blob.size)
        ctx.status.gauge("patch_last_bytes", m.blob.size)
        ctx.status.gauge("publish_ms", (time.monotonic() - t0) * 1000)
        self._retention()
        for item in pv.items:
            self._mirror(m.version, item.envelope, item.manifest.blob.id, item.blob)
        if m.version % max(1, ctx.config.checkpoint_every) == 0:
            self.grpo.save(self.checkpoint)
        log.info("published v%d (%s, %d bytes)", m.version, m.kind, m.blob.size)
        return pv

    def record_head(self) -> None:
        """Put the chain's head (a restarted trainer's) into the status."""
        head = self.chain.state
        if head is not None:
            self.ctx.status.set(weights_hash=weights_hash(head))
            self.ctx.status.record_hash(self.version, weights_hash(head))
            self.record_sha(self.version, head)

    def record_sha(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Each version's full-model SHA-256 for run summaries, only when asked (one hash of the model)."""
        if not self.ctx.config.report_weights_sha256:
            return
        sha = sha256_of_state(state)
        self.ctx.status.set(weights_sha256=sha)
        with self._sha_lock:
            shas = dict(self.ctx.status.get("sha256_by_version") or {})
            shas[str(version)] = sha
            for k in sorted(shas, key=int)[:-64]:
                del shas[k]
        self.ctx.status.set(sha256_by_version=shas)

    def _retention(self) -> None:
        dropped = self.chain.prune()
        if dropped:
            self.ctx.status.incr("blobs_retired", len(dropped))

    def _mirror(self, version: int, envelope: bytes, blob_id: str, blob: bytes) -> None:
        s3 = self.ctx.net.s3
        if s3 is None:
            return
        try:
            s3.publish_version(version, envelope, {blob_id: blob})
            self.ctx.status.incr("s3_versions_mirrored")
        except Exception as e:  # S3 is a fallback: an outage must not stop training
            self.ctx.status.incr_label("s3_errors", type(e).__name__)
            log.warning("S3 mirror of v%d failed: %s", version, e)

    def _maybe_reannounce(self) -> None:
        """Gossip is lossy: re-send the newest manifests now and then (peers drop duplicates)."""
        now = time.monotonic()
        if now - self._last_reannounce < REANNOUNCE_S:
            return
        self._last_reannounce = now
        for env in self.recent_envelopes():
            self.ctx.publish_raw("manifests", env)

    def recent_envelopes(self) -> list[bytes]:
        """The newest anchor's manifest and every manifest after it: all a late joiner needs."""
        manifests = self.chain.manifests
        anchors = [m.version for m in manifests.all() if m.kind == "anchor"]
        return manifests.envelopes(since=max(anchors, default=0))[-PatchManifest.REANNOUNCED :]
