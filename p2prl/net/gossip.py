"""The checks every gossip message passes before the node sees it (and before we forward it).

Order: ban list, size (before any parsing), per-forwarder rate, the budget of signers without
standing (read from the envelope's header, before any signature is verified), envelope signature
and schema (``decode_message``), topic/type match, signer allow-list, replay window and duplicate
digest. A failing message is dropped, counted under its reason, and not forwarded; nor is one the
node could not take in (its queue full): it forwards only what it accepted. A forwarder that keeps
sending invalid messages is banned.

*Standing*: the genesis's keys (trainer, validators), and a miner once a genesis validator's verdict
accepted a batch of it (or the node's own validator role did: ``grant``). Messages from every other
key share one budget (``unproven_msgs_per_s``) and one per key, charged before Ed25519: a flood from
fresh keys costs a header read per message, and squeezes only other keys without standing. A forger
naming a key in standing skips the budget but fails the signature check, a strike towards its
forwarder's ban. Runs inside libp2p's validator hook, so it must be fast and
must never raise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from p2prl.crypto import Envelope, EnvelopeError, ReplayGuard, claimed_signer
from p2prl.lru import LRU
from p2prl.net.config import Limits
from p2prl.net.counters import Counters
from p2prl.net.topics import TOPIC_TYPES, kind_of
from p2prl.protocol import MessageError, Verdict, decode_message
from p2prl.reasons import QUIET_DROPS, STRIKE_REASONS, BanReason, GossipDrop, InputReason

log = logging.getLogger(__name__)
WARN_EVERY_S = 60.0  # a drop reason is logged as a warning at most this often
M = TypeVar("M")


@dataclass(frozen=True)
class Incoming(Generic[M]):
    """A verified gossip message: the envelope, its parsed body (``M``: one of the protocol's
    message classes, the one the envelope's type names), and who handed it to us."""

    topic: str
    envelope: Envelope
    message: M
    from_peer: str  # the forwarding peer (base58)
    origin: str  # the peer that published it (base58)


class TokenBuckets:
    """Per-key token buckets with a bounded number of keys (oldest forgotten first)."""

    def __init__(self, rate: float, burst: int, max_keys: int = 4096) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max_keys
        self._b: LRU[str, tuple[float, float]] = LRU(max_keys)

    def allow(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        tokens, last = self._b.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        self._b.put(key, (tokens - 1.0 if ok else tokens, now))
        return ok


class GossipFilter:
    def __init__(
        self,
        network_id: str,
        limits: Limits,
        counters: Counters,
        deliver: Callable[[Incoming], bool],
        ban: Callable[[str, str], None],
        allowed_signers: dict[str, set[bytes]] | None = None,
    ) -> None:
        self.network_id = network_id
        self.limits = limits
        self.counters = counters
        self.deliver = deliver
        self.ban = ban
        self.allowed_signers = allowed_signers or {}
        self.replay = ReplayGuard(max_age_s=limits.replay_window_s, capacity=limits.replay_capacity)
        self.buckets = TokenBuckets(limits.peer_msgs_per_s, limits.peer_msg_burst)
        self.unproven = TokenBuckets(limits.unproven_msgs_per_s, limits.unproven_burst, max_keys=1)
        self.unproven_signers = TokenBuckets(limits.unproven_signer_per_s, limits.unproven_signer_burst)
        self.standing: LRU[bytes, None] = LRU(limits.standing_max)
        self._standing_lock = threading.Lock()
        self._genesis_keys = frozenset(k for keys in self.allowed_signers.values() for k in keys)
        self._validators = self.allowed_signers.get(Verdict.TYPE)
        self.strikes: dict[str, int] = {}
        self.banned: set[str] = set()
        self._warned: dict[str, float] = {}  # reason -> when last logged as a warning (reasons: a fixed set)
        self._held: dict[str, int] = {}

    def drop(self, reason: str, forwarder: str, detail: str = "") -> bool:
        self.counters.add(f"dropped.{reason}")
        self.counters.add("dropped")
        lvl, more = self._log_level(reason)
        log.log(lvl, "dropped gossip from %s: %s %s%s", forwarder[-8:], reason, detail, more)
        if reason in STRIKE_REASONS and forwarder not in self.banned:
            n = self.strikes.get(forwarder, 0) + 1
            self.strikes[forwarder] = n
            if n >= self.limits.max_invalid_per_peer:
                self.ban(forwarder, f"{BanReason.INVALID_GOSSIP}: {n} invalid gossip messages")
        return False

    def _log_level(self, reason: str) -> tuple[int, str]:
        """A warning per reason at most every ``WARN_EVERY_S`` (a burst of late re-gossip after a
        restart would fill the log), the rest at debug; the counters keep every drop."""
        if reason in QUIET_DROPS:
            return logging.DEBUG, ""
        now = time.monotonic()
        last = self._warned.get(reason)
        if last is not None and now - last < WARN_EVERY_S:
            self._held[reason] = self._held.get(reason, 0) + 1
            return logging.DEBUG, ""
        self._warned[reason] = now
        held = self._held.pop(reason, 0)
        return logging.WARNING, f" ({held} more since the last warning)" if held else ""

    def grant(self, signer: bytes) -> None:
        """``signer`` has standing: its messages skip the budget of unproven keys (any thread)."""
        with self._standing_lock:
            self.standing.put(bytes(signer), None)

    def in_standing(self, signer: bytes) -> bool:
        if signer in self._genesis_keys:
            return True
        with self._standing_lock:
            return signer in self.standing

    def _within_unproven_budget(self, data: bytes, now: float) -> bool:
        signer = claimed_signer(data)
        if signer is None or self.in_standing(signer):
            return True  # malformed: the envelope check drops it (and strikes its forwarder)
        return self.unproven_signers.allow(signer.hex(), now) and self.unproven.allow("*", now)

    def note_own(self, data: bytes) -> None:
        """Remember an envelope we publish, so an echo of it is a duplicate."""
        try:
            env, _ = decode_message(data, self.network_id)
            self.replay.check(env)
        except (EnvelopeError, MessageError):
            pass

    def check(self, topic_name: str, data: bytes, forwarder: str, origin: str) -> bool:
        """True: deliver and forward. False: dropped (and counted)."""
        try:
            return self._check(topic_name, data, forwarder, origin)
        except Exception as e:  # a validator that raises would be swallowed by libp2p
            log.exception("gossip check failed")
            return self.drop(GossipDrop.INTERNAL, forwarder, repr(e))

    def _check(self, topic_name: str, data: bytes, forwarder: str, origin: str) -> bool:
        if forwarder in self.banned or origin in self.banned:
            return self.drop(GossipDrop.BANNED, forwarder)
        if len(data) > self.limits.max_msg_bytes:
            return self.drop(InputReason.OVERSIZED, forwarder, f"{len(data)} bytes")
        if not self.buckets.allow(forwarder):
            return self.drop(GossipDrop.RATE_LIMITED, forwarder)
        kind = kind_of(self.network_id, topic_name)
        if kind is None:
            return self.drop(GossipDrop.NOT_OURS, forwarder, topic_name)
        if not self._within_unproven_budget(data, time.monotonic()):
            return self.drop(GossipDrop.UNPROVEN_BUDGET, forwarder)
        try:
            env, msg = decode_message(data, self.network_id)
        except EnvelopeError as e:
            return self.drop(e.reason, forwarder, str(e))
        except MessageError as e:
            return self.drop(e.reason, forwarder, str(e))
        if env.type not in TOPIC_TYPES[kind]:
            return self.drop(GossipDrop.WRONG_TOPIC, forwarder, f"{env.type} on {kind}")
        allowed = self.allowed_signers.get(env.type)
        if allowed is not None and env.signer not in allowed:
            return self.drop(InputReason.UNKNOWN_SIGNER, forwarder, env.signer_hex[:16])
        try:
            self.replay.check(env)
        except EnvelopeError as e:
            return self.drop(e.reason, forwarder)
        self.counters.add("gossip_in")
        if isinstance(msg, Verdict) and self._validators and env.signer in self._validators and msg.accepted:
            self._grant_hex(msg.miner)
        if not self.deliver(Incoming(topic_name, env, msg, forwarder, origin)):
            return self.drop(GossipDrop.QUEUE_FULL, forwarder, env.type)  # not taken: not forwarded
        return True

    def _grant_hex(self, miner: str) -> None:
        try:
            self.grant(bytes.fromhex(miner))
        except ValueError:
            pass
