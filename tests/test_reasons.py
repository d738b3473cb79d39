"""The reason codes are wire and metric strings: pin every one, so a rename cannot slip through."""

from p2prl.reasons import (
    HARD_FAILURES,
    QUIET_DROPS,
    SOFT_FAILURES,
    STRIKE_REASONS,
    BanReason,
    GossipDrop,
    InputReason,
    NodeDrop,
    PatchReason,
    VerdictReason,
)

# the strings as they were carried in verdicts, counters and logs before the enums existed
WIRE = {
    InputReason: "malformed oversized bad_magic truncated trailing_bytes bad_type bad_body bad_network "
    "unexpected_type unknown_type unknown_signer bad_signature stale future replayed",
    GossipDrop: "banned rate_limited not_ours wrong_topic internal queue_full unproven_budget publish_queue_full",
    BanReason: "invalid_gossip bad_chunk",
    VerdictReason: "ok blob_mismatch stale future_version unknown_version manifest_mismatch index_gap "
    "distribution not_checked unreachable batch_malformed batch_oversized batch_vocab header_mismatch group_count "
    "commitment_mismatch duplicate_index index_order group_size length prompt_mismatch reward duplicate "
    "copied fingerprint logprob distribution_batch sampling not_receipted unknown_receipts",
    NodeDrop: "duplicate_announcement known_unfetchable signer_quota validator_queue_full "
    "validator_queue_evicted verdict_signer verdict_veto verdict_after_decision verdict_unknown_blob "
    "verdict_mismatch fetch_queue_full stale_rollouts vetoed_rollouts barred_rollouts manifest s3_manifest "
    "heartbeat_peer_mismatch chain_start unchained receipts_full",
    PatchReason: "malformed unsupported wrong_base hash_mismatch bad_manifest unavailable bad_input",
}


def test_every_reason_is_its_old_string():
    for enum, words in WIRE.items():
        assert [m.value for m in enum] == words.split(), enum.__name__
        for m in enum:  # the member is the string: in sets, dict keys, f-strings and JSON alike
            assert m == m.value and hash(m) == hash(m.value) and f"{m}" == str(m) == m.value


# each set as it was spelled out beside its use (proof/validate.py, net/gossip.py)
SETS = {
    "hard": (
        HARD_FAILURES,
        "batch_malformed batch_oversized batch_vocab header_mismatch group_count commitment_mismatch "
        "duplicate_index index_order group_size length prompt_mismatch reward duplicate copied "
        "fingerprint logprob distribution_batch sampling not_receipted",
    ),
    "soft": (
        SOFT_FAILURES,
        "blob_mismatch stale future_version unknown_version manifest_mismatch index_gap distribution "
        "not_checked unreachable unknown_receipts",
    ),
    "strike": (
        STRIKE_REASONS,
        "oversized bad_magic truncated trailing_bytes bad_type bad_signature bad_body unknown_type "
        "malformed wrong_topic not_ours",
    ),
    "quiet": (QUIET_DROPS, "replayed rate_limited banned"),
}


def test_the_reason_sets_are_unchanged():
    for name, (got, words) in SETS.items():
        assert set(words.split()) == got, name
    assert not HARD_FAILURES & SOFT_FAILURES and "ok" not in HARD_FAILURES | SOFT_FAILURES
    assert not QUIET_DROPS & STRIKE_REASONS
