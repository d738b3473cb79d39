"""Every reason code p2prl puts on the wire, in counters or in logs: one vocabulary, as StrEnums.

A member *is* its string (``InputReason.BAD_BODY == "bad_body"``), so verdicts, metric labels
(``dropped{reason}``, ``rejected{reason}``) and log lines carry the same bytes they always did;
tests/test_reasons.py pins every value. Kept here, below every other part, so that crypto,
protocol, patch, proof, net and node all name a reason the same way.
"""

from __future__ import annotations

from enum import StrEnum


class InputReason(StrEnum):
    """Why an envelope or message body from a peer was refused (``EnvelopeError``, ``MessageError``)."""

    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    BAD_MAGIC = "bad_magic"
    TRUNCATED = "truncated"
    TRAILING_BYTES = "trailing_bytes"
    BAD_TYPE = "bad_type"
    BAD_BODY = "bad_body"
    BAD_NETWORK = "bad_network"
    UNEXPECTED_TYPE = "unexpected_type"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_SIGNER = "unknown_signer"
    BAD_SIGNATURE = "bad_signature"
    # the replay guard's
    STALE = "stale"
    FUTURE = "future"
    REPLAYED = "replayed"


class GossipDrop(StrEnum):
    """Why the gossip filter dropped a message it did not even try to parse (or could not deliver)."""

    BANNED = "banned"
    RATE_LIMITED = "rate_limited"
    NOT_OURS = "not_ours"  # a topic of another network
    WRONG_TOPIC = "wrong_topic"  # a type that does not belong on its topic
    INTERNAL = "internal"  # the check itself failed: dropped, never raised into libp2p
    QUEUE_FULL = "queue_full"  # checked, but the node's incoming queue was full: not forwarded either
    UNPROVEN_BUDGET = "unproven_budget"  # a signer without standing, over the budget for such (before any verify)
    PUBLISH_QUEUE_FULL = "publish_queue_full"


# what says the forwarder sent garbage (counted towards its ban); any other drop can be innocent
STRIKE_REASONS: frozenset[str] = frozenset(
    {
        InputReason.OVERSIZED,
        InputReason.BAD_MAGIC,
        InputReason.TRUNCATED,
        InputReason.TRAILING_BYTES,
        InputReason.BAD_TYPE,
        InputReason.BAD_SIGNATURE,
        InputReason.BAD_BODY,
        InputReason.UNKNOWN_TYPE,
        InputReason.MALFORMED,
        GossipDrop.WRONG_TOPIC,
        GossipDrop.NOT_OURS,
    }
)
# dropped often and innocently (an echo, a burst, a peer already cut off): logged at debug only
QUIET_DROPS: frozenset[str] = frozenset({InputReason.REPLAYED, GossipDrop.RATE_LIMITED, GossipDrop.BANNED})


class BanReason(StrEnum):
    """Why a peer was cut off for a while."""

    INVALID_GOSSIP = "invalid_gossip"  # too many strikes
    BAD_CHUNK = "bad_chunk"  # served a chunk that does not hash to its reference


class VerdictReason(StrEnum):
    """A validator's judgement of one rollout group, as carried in a signed ``Verdict``."""

    OK = "ok"
    # transport / bookkeeping: not surely the miner's fault (soft)
    BLOB_MISMATCH = "blob_mismatch"
    STALE = "stale"
    FUTURE_VERSION = "future_version"
    UNKNOWN_VERSION = "unknown_version"
    MANIFEST_MISMATCH = "manifest_mismatch"
    INDEX_GAP = "index_gap"  # the batch does not start at the miner's next prompt index for the version
    DISTRIBUTION = "distribution"  # one rollout's tokens are unlikely: the group is dropped, no penalty
    NOT_CHECKED = "not_checked"  # another group of the same batch failed hard
    # the batch could not be fetched from anyone: the miner is unreachable from this validator (on one
    # machine or a LAN, every node needs --local-network) or went away before it was fetched
    UNREACHABLE = "unreachable"
    # the miner signed something wrong (hard)
    BATCH_MALFORMED = "batch_malformed"
    BATCH_OVERSIZED = "batch_oversized"
    BATCH_VOCAB = "batch_vocab"
    HEADER_MISMATCH = "header_mismatch"
    GROUP_COUNT = "group_count"
    COMMITMENT_MISMATCH = "commitment_mismatch"
    DUPLICATE_INDEX = "duplicate_index"
    INDEX_ORDER = "index_order"  # a batch's prompt indices are not consecutive
    GROUP_SIZE = "group_size"
    LENGTH = "length"
    PROMPT_MISMATCH = "prompt_mismatch"
    REWARD = "reward"
    DUPLICATE = "duplicate"
    COPIED = "copied"
    FINGERPRINT = "fingerprint"
    LOGPROB = "logprob"
    DISTRIBUTION_BATCH = "distribution_batch"  # the whole batch's tokens are: proof of another sampler
    SAMPLING = "sampling"  # tokens not drawn from their public uniforms: sharpened, re-drawn or picked
    NOT_RECEIPTED = "not_receipted"  # a chained batch's Receipts do not list its previous batch (hard)
    # a chained batch names a trainer's Receipts this validator does not hold (yet): soft
    UNKNOWN_RECEIPTS = "unknown_receipts"


# proof of misbehaviour (an honest miner never produces them): they zero the miner's score window
# and a genesis validator's one vetoes the blob at the trainer
HARD_FAILURES: frozenset[str] = frozenset(
    {
        VerdictReason.BATCH_MALFORMED,
        VerdictReason.BATCH_OVERSIZED,
        VerdictReason.BATCH_VOCAB,
        VerdictReason.HEADER_MISMATCH,
        VerdictReason.GROUP_COUNT,
        VerdictReason.COMMITMENT_MISMATCH,
        VerdictReason.DUPLICATE_INDEX,
        VerdictReason.INDEX_ORDER,
        VerdictReason.GROUP_SIZE,
        VerdictReason.LENGTH,
        VerdictReason.PROMPT_MISMATCH,
        VerdictReason.REWARD,
        VerdictReason.DUPLICATE,
        VerdictReason.COPIED,
        VerdictReason.FINGERPRINT,
        VerdictReason.LOGPROB,
        VerdictReason.DISTRIBUTION_BATCH,
        VerdictReason.SAMPLING,
        VerdictReason.NOT_RECEIPTED,
    }
)
# rejections that only drop the batch or group
SOFT_FAILURES: frozenset[str] = frozenset(VerdictReason) - HARD_FAILURES - {VerdictReason.OK}


class NodeDrop(StrEnum):
    """Why a node dropped a checked message (the ``dropped{reason}`` metric, with the gossip drops)."""

    # announcements
    DUPLICATE_ANNOUNCEMENT = "duplicate_announcement"
    KNOWN_UNFETCHABLE = "known_unfetchable"
    SIGNER_QUOTA = "signer_quota"
    VALIDATOR_QUEUE_FULL = "validator_queue_full"
    VALIDATOR_QUEUE_EVICTED = "validator_queue_evicted"
    # verdicts at the trainer
    VERDICT_SIGNER = "verdict_signer"
    VERDICT_VETO = "verdict_veto"
    VERDICT_AFTER_DECISION = "verdict_after_decision"
    VERDICT_UNKNOWN_BLOB = "verdict_unknown_blob"
    VERDICT_MISMATCH = "verdict_mismatch"
    # rollouts at the trainer
    FETCH_QUEUE_FULL = "fetch_queue_full"
    STALE_ROLLOUTS = "stale_rollouts"
    VETOED_ROLLOUTS = "vetoed_rollouts"
    BARRED_ROLLOUTS = "barred_rollouts"  # groups of a key barred from training after a hard failure
    # manifests and heartbeats
    MANIFEST = "manifest"
    S3_MANIFEST = "s3_manifest"
    HEARTBEAT_PEER_MISMATCH = "heartbeat_peer_mismatch"
    # groups validated but trained by nobody: a chain start (its key chose its seed), or a chained
    # batch whose previous batch this trainer did not receipt and accept, or whose receipt seeded one before
    CHAIN_START = "chain_start"
    UNCHAINED = "unchained"
    RECEIPTS_FULL = "receipts_full"  # an announcement over the receipts' bound: receipted by no list


class PatchReason(StrEnum):
    """Why a patch, anchor, safetensors file or chain step cannot be used (``PatchError``)."""

    MALFORMED = "malformed"  # bytes that are not a valid patch, stream, anchor or safetensors file
    UNSUPPORTED = "unsupported"  # a format version, codec or dtype this build does not know
    WRONG_BASE = "wrong_base"  # the patch is for other weights than the ones it is applied to
    HASH_MISMATCH = "hash_mismatch"  # a digest or weights hash that does not match its declaration
    BAD_MANIFEST = "bad_manifest"  # a manifest that does not verify or contradicts another
    UNAVAILABLE = "unavailable"  # a blob, file or chain step that cannot be had
    BAD_INPUT = "bad_input"  # local arguments the encoder or planner cannot use
