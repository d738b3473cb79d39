"""Every metric a node writes, declared once: its kind and its help (the Prometheus HELP line).

:class:`~p2prl.node.runtime.status.NodeStatus` mints no metric from an undeclared name: a write under one
(a typo, a renamed stat) is counted as ``undeclared_metric{name}`` and logged once, so it shows
instead of silently starting a new series. tests/node/runtime/test_metrics.py checks every literal name
written in the package against this table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    COUNTER = "counter"  # NodeStatus.incr
    LABELLED = "labelled"  # NodeStatus.incr_label: a counter by reason (bounded labels)
    GAUGE = "gauge"  # NodeStatus.gauge / gauge_max


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    help: str


def _family(prefix: str, kind: Kind, suffixes: Iterable[str], help: str) -> list[Metric]:
    """Metrics written as ``f"{prefix}{k}"`` for the listed ``k``."""
    return [Metric(prefix + k, kind, help.format(k=k)) for k in suffixes]


C, L, G = Kind.COUNTER, Kind.LABELLED, Kind.GAUGE

_DECLARED: list[Metric] = [
    # miner
    Metric("groups_produced", C, "Rollout groups this miner generated."),
    Metric("rollouts_produced", C, "Rollouts this miner generated."),
    Metric("batches_announced", C, "Rollout batches this miner announced."),
    Metric("batches", L, "Rollout batches this miner announced, by kind: chained (following a receipt) or chain_start."),
    Metric("batch_failed", L, "Batches this miner could not make or announce, by error."),
    Metric("batch_bytes", G, "Size of the miner's last rollout batch blob."),
    Metric("tokens_per_s", G, "The miner's generation throughput (completion tokens per second)."),
    Metric("own_score", G, "This miner's score in the validators' latest Scores."),
    Metric("engine_weights_checked", C, "Version switches whose vLLM engine weights were read back."),
    Metric("engine_write_bytes", G, "Bytes the last switch wrote into an engine that keeps its own copy."),
    Metric("engine_weights_mismatch", C, "Of those, switches whose engine weights were not the version's."),
    # validator (groups_accepted/_rejected and rejected also count verdicts about a miner itself)
    Metric("groups_accepted", C, "Rollout groups accepted (validator: its verdicts; miner: about it)."),
    Metric("groups_rejected", C, "Rollout groups rejected (validator: its verdicts; miner: about it)."),
    Metric("rollouts_accepted", C, "Rollouts in accepted groups."),
    Metric("rollouts_rejected", C, "Rollouts in rejected groups."),
    Metric("batches_checked", C, "Rollout batches the validator judged."),
    Metric("rollouts_float32", C, "Recomputed rollouts that looked off in bf16, judged again in float32."),
    Metric("side_positions", C, "Recomputed positions whose token was not the validator's pick."),
    Metric("sides_judged", C, "Of them, judged by a continuation from the position (proof.sides)."),
    Metric("sides_won", C, "Judged positions where the miner's rollout earned more than the continuation."),
    Metric("sides_lost", C, "Judged positions where it earned less."),
    Metric("rejected", L, "Rejected rollout groups by verdict reason."),
    Metric("check_failed", L, "Batches the validator could not check, by error."),
    Metric("rollout_unfetchable", L, "Announced batches the validator could not fetch, by reason."),
    Metric("rollout_fetch_retries", L, "Announced batches the validator asked for again, by reason."),
    Metric("judge_backlog", G, "Announcements queued at the validator, waiting to be judged."),
    Metric("judge_in_hand", G, "Announcements the validator is fetching or judging now, or holding for the batch before them."),
    Metric("calibrated_version", G, "The version the validator's tolerances were last measured at."),
    Metric("recalibrations", C, "Times the validator measured its tolerances again as the model trained."),
    Metric("batches_held", C, "Batches held for their miner's batch before them (gossip delivered them out of order)."),
    Metric("judge_lag_s", G, "Age of the oldest announcement queued at the validator (s)."),
    Metric("check_ms", G, "Time the validator took to check its last batch (ms)."),
    *_family(
        "proof_",
        G,
        ("fingerprint_tol", "fingerprint_tol_rollout", "logprob_tol_mean", "logprob_tol_max"),
        "The validator's calibrated proof tolerance {k}.",
    ),
    *_family(
        "proof_",
        G,
        ("fingerprint_err_max", "fingerprint_err_group_max", "logprob_err_max"),
        "Largest proof error {k} seen in an accepted batch.",
    ),
    # trainer
    Metric("versions_published", C, "Weight versions the trainer published."),
    Metric("train_steps", C, "GRPO steps taken."),
    Metric("train_steps_skipped", C, "GRPO steps skipped (every group's rewards equal)."),
    Metric("groups_consumed", C, "Rollout groups the trainer took into its replay buffer."),
    Metric("rollouts_consumed", C, "Rollouts the trainer took into its replay buffer."),
    Metric("receipts_sent", C, "Receipts lists the trainer signed and sent."),
    Metric("receipts_resent", C, "Receipts lists sent again while a receipt in them was unused."),
    Metric("verdicts_received", C, "Validator verdicts the trainer received."),
    Metric("verdict_vetoes", C, "Batches a validator's hard failure vetoed."),
    Metric("keys_barred", L, "Miner keys barred from training after a hard failure, by why."),
    Metric("rollouts_unverified", C, "Rollouts the trainer's token check left out of a step."),
    Metric("s3_versions_mirrored", C, "Versions mirrored to the S3 bucket."),
    Metric("blobs_retired", C, "Blobs dropped by the trainer's retention."),
    Metric("rollout_fetch_failed", L, "Rollout batches the trainer could not fetch, by reason."),
    Metric("publish_ms", G, "Time the trainer took to publish its last version (ms)."),
    Metric("patch_encode_ms", G, "Time the trainer took to encode its last patch (ms)."),
    Metric("train_step_ms", G, "Time of the last GRPO step (ms)."),
    *_family(
        "train_",
        G,
        ("loss", "clip_frac", "kl", "grad_norm", "reward_mean"),
        "The last trained GRPO step's {k}.",
    ),
    # every role: weights sync
    Metric("patches_applied", C, "Patches applied to this node's weights."),
    Metric("patch_bytes_total", C, "Bytes of patches applied."),
    Metric("slow_path_syncs", C, "Syncs that went back to an anchor."),
    Metric("hash_mismatches", C, "Applied patches whose result did not match the signed hash."),
    Metric("sync_failures", C, "Syncs that failed."),
    Metric("sync_failed", L, "Failed syncs by reason."),
    Metric("s3_errors", L, "S3 errors by kind."),
    Metric("patch_last_bytes", G, "Size of the last patch applied."),
    Metric("patch_apply_ms", G, "Time the last patch took to apply (ms)."),
    Metric("weights_save_ms", G, "Time the last save of the weights to disk took (ms; at most every 30 s and at stop)."),
    Metric("patch_verify_ms", G, "Time the last patch took to check beside generation, before the swap (ms)."),
    Metric("patch_confirm_ms", G, "Time the last switch's result took to hash beside generation, after the swap (ms; miners)."),
    Metric("patch_fetch_ms", G, "Time the last patch took to fetch (ms)."),
    # every role: node
    Metric("restarts_resumed", C, "Starts that resumed this node's saved state."),
    Metric("peers_dialed", C, "Peers this node dialled."),
    Metric("dropped", L, "Peer inputs dropped, by reason."),
    Metric("handler_error", L, "Gossip handlers that raised, by message type."),
    Metric("publish_failed", L, "Gossip publishes that failed, by error."),
    Metric("thread_crash", L, "Node threads that crashed (the node then stops), by thread."),
    Metric("warnings", L, "Warnings at start, by kind."),
    Metric("assets_fetched", L, "Genesis assets fetched, by asset."),
    Metric("asset_fetch_failed", L, "Genesis assets that could not be fetched, by asset."),
    Metric("undeclared_metric", L, "Writes under a name this table does not declare, by name."),
    *_family(
        "net_",
        G,
        ("bytes_up", "bytes_down", "bytes_s3", "dropped", "bans"),
        "The network layer's {k} so far.",
    ),
]

METRICS: dict[str, Metric] = {m.name: m for m in _DECLARED}
if len(METRICS) != len(_DECLARED):
    raise ValueError("a metric is declared twice")


def declared(name: str, kind: Kind) -> bool:
    """Whether ``name`` is declared, and as ``kind``."""
    m = METRICS.get(name)
    return m is not None and m.kind is kind
