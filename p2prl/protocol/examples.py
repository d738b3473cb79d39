"""Worked examples of every message type: real signed envelopes from fixed keys and times.

Ed25519 signatures are deterministic, so these bytes are the same on every machine: docs/PROTOCOL.md
§8 prints them (``python -m p2prl.protocol.examples`` renders that section) and a test checks that
the spec and this module agree and that every example decodes and verifies. A second implementation
can test its encoder and decoder against them byte for byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from p2prl.crypto import Identity, canonical_bytes
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.chains import receipt_id
from p2prl.protocol.messages import (
    Genesis,
    GroupVerdict,
    Heartbeat,
    Message,
    PatchManifest,
    Receipts,
    RolloutAnnouncement,
    Scores,
    Verdict,
    encode_message,
)
from p2prl.protocol.sections import GenerationSpec, ModelSpec, PatchSpec, PromptSpec, TaskSpec

NETWORK = "example-net"
CREATED_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TRAINER = Identity(bytes([1]) * 32)
VALIDATOR = Identity(bytes([2]) * 32)
MINER = Identity(bytes([3]) * 32)
WRAP = 96  # hex characters per line in the spec
# the libp2p peer ids of the trainer's and the miner's keys (a test derives them again)
TRAINER_PEER_ID = "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"
MINER_PEER_ID = "12D3KooWRndVhVZPCiQwHBBBdg769GyrPUW13zxwqQyf9r3ANaba"
# the built-in model as `p2prl network init` describes it (a test rebuilds it and compares): the
# genesis example is one a node would run
BUILTIN_MODEL = ModelSpec(
    name="p2prl-tiny-addition-v3",
    source="builtin",
    architecture="Qwen2ForCausalLM",
    dtype="bfloat16",
    parameters=138_112,
    weights_hash="93806ea9a7408c861830a120c9b2d9a205ffca9f6d2c371b00b33cc61cee1bf1",
    config_sha256="d2f1a3dfa7e1615ecf0c641c0718e1a1aea14e30701fc979ecc376197483bd1f",
    tokenizer_sha256="25e2dab26aa5690b06fe911e17ccc734e9e0617b1a4804429db03f46f466fcad",
    files_sha256="",
    files_size=0,
)


@dataclass(frozen=True)
class Example:
    signer: str  # which of the fixed keys signed it
    message: Message
    raw: bytes

    @property
    def message_body(self) -> str:
        return canonical_bytes(self.message.to_body()).decode()


def _h(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def examples() -> Iterator[Example]:
    """One signed envelope of each message type, in the order of the spec's type table."""
    patch_ref = blob_ref_for(b"\x00" * 40_000, 16 * 1024)
    rollouts_ref = blob_ref_for(b"rollouts" * 1000, 1 << 20)
    earlier_ref = blob_ref_for(b"earlier rollouts" * 500, 1 << 20)  # the miner's previous batch
    messages: list[tuple[str, Identity, Message]] = [
        (
            "trainer",
            TRAINER,
            Genesis(
                network_id=NETWORK,
                trainer=TRAINER.public_hex,
                model=BUILTIN_MODEL,
                prompt=PromptSpec(),
                task=TaskSpec(name="addition", params={"digits": 2}),
                generation=GenerationSpec(stop_token_ids=(1,)),
                patch=PatchSpec(),
                validators=(VALIDATOR.public_hex,),
                bootstrap=(f"/ip4/192.0.2.1/tcp/4001/p2p/{TRAINER_PEER_ID}",),
                s3=None,
                max_staleness=4,
                created_ms=CREATED_MS,
            ),
        ),
        (
            "trainer",
            TRAINER,
            PatchManifest(
                version=7,
                base_version=6,
                base_hash=_h("weights v6"),
                result_hash=_h("weights v7"),
                kind="delta",
                codec="p2prl-sparse-v1",
                blob=patch_ref,
                anchor_version=0,
                created_ms=CREATED_MS,
            ),
        ),
        (
            "trainer",
            TRAINER,
            Receipts(
                entries=tuple(sorted({receipt_id(MINER.public_key, earlier_ref.id), _h("another key's batch")[:32]})),
                nonce=_h("nonce")[:32],
                created_ms=CREATED_MS,
            ),
        ),
        (
            "miner",
            MINER,
            RolloutAnnouncement(
                version=7,
                manifest_hash=_h("weights v7"),
                blob=rollouts_ref,
                groups=2,
                commitment_root=_h("commitments"),
                created_ms=CREATED_MS,
                prev=earlier_ref.id,
                receipts="0" * 64,  # replaced below by the digest of the receipts above
            ),
        ),
        (
            "validator",
            VALIDATOR,
            Verdict(
                blob_id=rollouts_ref.id,
                miner=MINER.public_hex,
                version=7,
                groups=(
                    GroupVerdict(0, True, "ok"),
                    GroupVerdict(1, False, "reward_mismatch"),
                ),
                announcement="0" * 64,  # replaced below by the digest of the announcement above
                created_ms=CREATED_MS,
            ),
        ),
        (
            "validator",
            VALIDATOR,
            Scores(version=7, window=4, scores={MINER.public_hex: 1}, created_ms=CREATED_MS),
        ),
        (
            "miner",
            MINER,
            Heartbeat(
                role="miner",
                version=7,
                peer_id=MINER_PEER_ID,
                addrs=("/ip4/192.0.2.7/tcp/4001",),
                holds=(patch_ref.id,),
                stats={"rollouts": 16},
                created_ms=CREATED_MS,
            ),
        ),
    ]
    judged = receipted = ""
    for who, ident, msg in messages:
        if isinstance(msg, Verdict):  # it judged the announcement envelope made just before
            msg = replace(msg, announcement=judged)
        if isinstance(msg, RolloutAnnouncement):  # chained on the receipts envelope made just before
            msg = replace(msg, receipts=receipted)
        raw = encode_message(ident, NETWORK, msg)
        if isinstance(msg, RolloutAnnouncement):
            judged = hashlib.sha256(raw).hexdigest()
        if isinstance(msg, Receipts):
            receipted = hashlib.sha256(raw).hexdigest()
        yield Example(who, msg, raw)


SECTION = "## 8. Worked examples"


def render() -> str:
    """The spec's §8 as Markdown."""
    keys = "\n".join(
        f"- {name}: seed `{ident.seed.hex()}`, public key `{ident.public_hex}`"
        for name, ident in (("trainer", TRAINER), ("validator", VALIDATOR), ("miner", MINER))
    )
    out = [
        SECTION,
        "",
        "Real envelopes made by `p2prl/protocol/examples.py` (`python -m p2prl.protocol.examples`",
        f"prints this section; a test keeps the two equal). Network id `{NETWORK}`, `created_ms`",
        f"{CREATED_MS}, and three fixed keys (the seed is 32 repeated bytes):",
        "",
        keys,
        "",
        f"The genesis names the built-in model `{BUILTIN_MODEL.name}` as `p2prl network init` describes it",
        "here (its weights ship with the package, the same bits on every CPU, so every node builds this",
        "hash; its `config.json` follows the transformers version), and the trainer's",
        f"address as bootstrap peer: `{TRAINER_PEER_ID}` is the trainer key's libp2p peer id (the",
        f"miner's, in its heartbeat, is `{MINER_PEER_ID}`).",
        "",
    ]
    for ex in examples():
        hx = ex.raw.hex()
        out += [
            f"### `{ex.message.TYPE}` signed by the {ex.signer} ({len(ex.raw)} bytes)",
            "",
            "Body (the canonical JSON it signs):",
            "",
            "```json",
            ex.message_body,
            "```",
            "",
            "Envelope, hex:",
            "",
            "```",
            *(hx[i : i + WRAP] for i in range(0, len(hx), WRAP)),
            "```",
            "",
        ]
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
