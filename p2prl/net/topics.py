"""Gossip topic names per network and which envelope types each topic may carry."""

from __future__ import annotations

MANIFESTS = "manifests"
ROLLOUTS = "rollouts"
VERDICTS = "verdicts"
HEARTBEATS = "heartbeats"

# topic kind -> envelope types that may travel on it (anything else is dropped as "wrong_topic")
TOPIC_TYPES: dict[str, frozenset[str]] = {
    MANIFESTS: frozenset({"patch_manifest", "genesis", "receipts"}),
    ROLLOUTS: frozenset({"rollout_announcement"}),
    VERDICTS: frozenset({"verdict", "scores"}),
    HEARTBEATS: frozenset({"heartbeat"}),
}


def topic(network_id: str, kind: str) -> str:
    if kind not in TOPIC_TYPES:
        raise ValueError(f"unknown topic kind {kind!r}")
    return f"p2prl/{network_id}/{kind}"


def manifests_topic(network_id: str) -> str:
    return topic(network_id, MANIFESTS)


def heartbeats_topic(network_id: str) -> str:
    return topic(network_id, HEARTBEATS)


def kind_of(network_id: str, name: str) -> str | None:
    """The kind of a topic name of this network, or None if it is not one of ours."""
    prefix = f"p2prl/{network_id}/"
    if not name.startswith(prefix):
        return None
    kind = name[len(prefix) :]
    return kind if kind in TOPIC_TYPES else None
