import hashlib

import pytest

from p2prl.crypto.envelope import EnvelopeError, seal
from p2prl.crypto.keys import Identity
from p2prl.protocol import (
    BlobRef,
    Genesis,
    GroupVerdict,
    Heartbeat,
    MessageError,
    PatchManifest,
    RolloutAnnouncement,
    Scores,
    Verdict,
    blob_ref_for,
    decode_message,
    encode_message,
    is_hex,
)
from p2prl.protocol.blobs import MIN_CHUNK_SIZE
from p2prl.protocol.sections import GenerationSpec, ModelSpec, PatchSpec, PromptSpec, TaskSpec

TRAINER = Identity(b"\x03" * 32)
H = "ab" * 32


def ref(data=b"x" * 100_000):
    return blob_ref_for(data, chunk_size=MIN_CHUNK_SIZE)


def samples():
    return [
        Genesis(
            network_id="n1",
            trainer=TRAINER.public_hex,
            model=ModelSpec("tiny", "hf", "Qwen2ForCausalLM", "bfloat16", 5, H, H, H, H, 100),
            prompt=PromptSpec("chat", "Be brief."),
            task=TaskSpec("addition", {"digits": 2}),
            generation=GenerationSpec(stop_token_ids=(1, 2)),
            patch=PatchSpec(),
            validators=(TRAINER.public_hex,),
            bootstrap=("/ip4/127.0.0.1/tcp/4001",),
            s3=None,
            max_staleness=4,
        ),
        PatchManifest(3, 2, H, H, "delta", "p2pz1", ref(), 0),
        PatchManifest(10, 10, "", H, "anchor", "safetensors", ref(), 10),
        RolloutAnnouncement(3, H, ref(), 4, H),
        Verdict(H, TRAINER.public_hex, 3, (GroupVerdict(0, True, "ok"),), announcement=H),
        Scores(3, 8, {TRAINER.public_hex: 5}),
        Heartbeat("miner", 3, "12D3KooW", ("/ip4/127.0.0.1/tcp/1",), (H,), {"rollouts": 2}),
    ]


@pytest.mark.parametrize("msg", samples(), ids=lambda m: m.TYPE)
def test_roundtrip(msg):
    raw = encode_message(TRAINER, "n1", msg)
    env, back = decode_message(raw, "n1")
    assert back == msg and env.signer == TRAINER.public_key


def test_blob_ref_chunks():
    data = bytes(range(256)) * 300
    r = ref(data)
    assert r.id == hashlib.sha256(data).hexdigest() and r.n_chunks == 5
    for i in range(r.n_chunks):
        chunk = data[i * r.chunk_size : (i + 1) * r.chunk_size]
        assert r.verify_chunk(i, chunk)
        assert not r.verify_chunk(i, chunk[:-1] + b"?")
    assert BlobRef.from_body(r.to_body()) == r
    empty = ref(b"")
    assert empty.n_chunks == 1 and empty.verify_chunk(0, b"")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(chunks=b["chunks"][:-1]),
        lambda b: b.update(id="zz"),
        lambda b: b.update(size=-1),
        lambda b: b.update(chunk_size=1),
        lambda b: b.update(chunks=["00"] * len(b["chunks"])),
        lambda b: b.pop("size"),
        lambda b: b.update(size=True),
    ],
)
def test_bad_blob_refs(mutate):
    body = ref().to_body()
    mutate(body)
    with pytest.raises(MessageError):
        BlobRef.from_body(body)


@pytest.mark.parametrize(
    "body",
    [
        {
            "version": 3,
            "base_version": 1,
            "base_hash": H,
            "result_hash": H,
            "kind": "delta",
            "codec": "c",
            "anchor_version": 0,
        },
        {
            "version": 3,
            "base_version": 2,
            "base_hash": "",
            "result_hash": H,
            "kind": "delta",
            "codec": "c",
            "anchor_version": 0,
        },
        {
            "version": 3,
            "base_version": 2,
            "base_hash": H,
            "result_hash": H,
            "kind": "full",
            "codec": "c",
            "anchor_version": 0,
        },
        {
            "version": 3,
            "base_version": 3,
            "base_hash": "",
            "result_hash": H,
            "kind": "anchor",
            "codec": "c",
            "anchor_version": 0,
        },
        {
            "version": 3,
            "base_version": 2,
            "base_hash": H,
            "result_hash": H,
            "kind": "delta",
            "codec": "c",
            "anchor_version": 9,
        },
    ],
)
def test_inconsistent_manifests_rejected(body):
    body = dict(body, blob=ref().to_body(), created_ms=1)
    raw = seal(TRAINER, "n1", "patch_manifest", body)
    with pytest.raises(MessageError):
        decode_message(raw, "n1")


def test_unknown_type_and_oversized():
    with pytest.raises(EnvelopeError) as e:
        decode_message(seal(TRAINER, "n1", "mystery", {"a": 1}), "n1")
    assert e.value.reason == "unknown_type"
    big = Heartbeat("miner", 1, "p", (), (), {}).to_body()
    big["peer_id"] = "p" * 100
    big["pad"] = "x" * 70_000  # unknown fields are ignored, but the size bound holds
    with pytest.raises(EnvelopeError) as e:
        decode_message(seal(TRAINER, "n1", "heartbeat", big), "n1")
    assert e.value.reason == "oversized"
    with pytest.raises(MessageError):
        encode_message(
            TRAINER, "n1", Heartbeat("miner", 1, "p" * 100, (), (), {f"k{i}": i for i in range(65)})
        )
    bad = Scores(1, 8, {TRAINER.public_hex: 1}).to_body()
    bad["scores"] = {"short": 1}
    with pytest.raises(MessageError):
        decode_message(seal(TRAINER, "n1", "scores", bad), "n1")


def test_verdict_groups_are_records_with_the_old_wire_bytes():
    """A verdict's groups were plain objects on the wire; the typed record signs the same bytes."""
    groups = (GroupVerdict(0, True, "ok"), GroupVerdict(7, False, "reward"))
    v = Verdict(H, TRAINER.public_hex, 3, groups, H, 5)
    old = {
        "blob_id": H,
        "miner": TRAINER.public_hex,
        "version": 3,
        "groups": [
            {"accepted": True, "index": 0, "reason": "ok"},
            {"accepted": False, "index": 7, "reason": "reward"},
        ],
        "announcement": H,
        "created_ms": 5,
    }
    assert seal(TRAINER, "n1", "verdict", v.to_body()) == seal(TRAINER, "n1", "verdict", old)
    assert Verdict.from_body(old) == v and v.accepted == 1


@pytest.mark.parametrize(
    "group",
    [
        "ok",
        {"index": 4096, "accepted": True, "reason": "ok"},
        {"index": -1, "accepted": True, "reason": "ok"},
        {"index": 0, "accepted": 1, "reason": "ok"},
        {"index": 0, "accepted": False, "reason": "r" * 65},
        {"index": 0, "accepted": False},
    ],
)
def test_group_verdicts_are_parsed_within_bounds(group):
    body = Verdict(H, TRAINER.public_hex, 3, (), H, 5).to_body()
    with pytest.raises(MessageError) as e:
        decode_message(seal(TRAINER, "n1", "verdict", dict(body, groups=[group])), "n1")
    assert e.value.reason == "bad_body"
    with pytest.raises(MessageError):
        Verdict.from_body(dict(body, groups=[{"index": 0, "accepted": True, "reason": "ok"}] * 4097))


def test_genesis_refuses_what_the_spec_calls_wrong():
    """Unknown top-level keys, a missing s3 entry, a model without its hashes, a boolean where an
    integer belongs and a patch key it does not know (the codec is each manifest's) are all refused,
    not silently read."""
    import copy

    from p2prl.protocol.examples import examples
    from p2prl.protocol.messages import Genesis, MessageError

    good = next(ex.message for ex in examples() if isinstance(ex.message, Genesis)).to_body()
    Genesis.from_body(copy.deepcopy(good))

    def broken(edit):
        b = copy.deepcopy(good)
        edit(b)
        return b

    cases = [
        broken(lambda b: b.update(surprise=1)),
        broken(lambda b: b.pop("s3")),
        broken(lambda b: b["model"].pop("weights_hash")),
        broken(lambda b: b["model"].update(weights_hash="")),
        broken(lambda b: b["model"].update(weights_hash="zz" * 32)),
        broken(lambda b: b["generation"].update(max_new_tokens=True)),
        broken(lambda b: b["patch"].update(codec="p2prl-sparse-v1")),
        broken(lambda b: b["task"].update(extra="x")),
    ]
    for body in cases:
        with pytest.raises(MessageError):
            Genesis.from_body(body)


@pytest.mark.parametrize("addr", ["hello", "", "ip4/192.0.2.1/tcp/4001", "/ip4/192.0.2.1/tcp/99999", "/ip4/192.0.2.1/tcp/01"])
def test_genesis_bootstrap_entries_must_be_multiaddrs(addr):
    """A ``bootstrap`` entry that is no multiaddr in its canonical text (``"hello"``, a port out of
    range, a non-canonical port) is refused as ``bad_body``: nodes dial these forever."""
    from p2prl.protocol.examples import examples
    from p2prl.protocol.messages import Genesis, MessageError

    good = next(ex.message for ex in examples() if isinstance(ex.message, Genesis)).to_body()
    Genesis.from_body(dict(good, bootstrap=["/ip4/192.0.2.1/tcp/4001", "/dns4/boot.example/tcp/1"]))
    with pytest.raises(MessageError) as e:
        decode_message(seal(TRAINER, good["network_id"], "genesis", dict(good, bootstrap=[addr])), good["network_id"])
    assert e.value.reason == "bad_body"


def test_is_hex_is_whole_lowercase_and_sized() -> None:
    assert is_hex(H, 32) and is_hex("") and is_hex("00ff")
    for bad in ("AB" * 32, H + "\n", H[:-1], "0g", "abc", None, 7, b"ab"):
        assert not is_hex(bad, 32 if isinstance(bad, str) and len(bad) >= 63 else None)


@pytest.mark.parametrize(
    "typ,body",
    [
        ("scores", {"version": 3, "window": 8, "scores": {"zz" * 32: 1}}),
        (
            "heartbeat",
            {"role": "miner", "version": 3, "peer_id": "p", "addrs": [], "holds": ["x" * 64], "stats": {}},
        ),
    ],
)
def test_keys_and_blob_ids_must_be_hex(typ, body):
    raw = seal(TRAINER, "n1", typ, dict(body, created_ms=1))
    with pytest.raises(MessageError):
        decode_message(raw, "n1")


def test_a_full_heartbeat_is_one_every_peer_accepts():
    """What a node puts in a heartbeat at most (the wiring bounds) stays inside the parser's bounds."""
    full = Heartbeat(
        "trainer",
        3,
        "12D3KooW",
        tuple(f"/ip4/127.0.0.{i}/tcp/4001" for i in range(Heartbeat.MAX_ADDRS)),
        tuple(hashlib.sha256(bytes([i % 256, i // 256])).hexdigest() for i in range(Heartbeat.SENT_HOLDS)),
        {f"counter_{i}": i for i in range(Heartbeat.SENT_STATS)},
    )
    _, back = decode_message(encode_message(TRAINER, "n1", full), "n1")
    assert back == full and len(encode_message(TRAINER, "n1", full)) <= Heartbeat.MAX_BYTES
    assert Heartbeat.SENT_HOLDS <= Heartbeat.MAX_HOLDS and Heartbeat.HINTED_HOLDS <= Heartbeat.MAX_HOLDS
    over = dict(full.to_body(), holds=list(full.holds) * 3)
    with pytest.raises(MessageError):
        Heartbeat.from_body(over)


def test_envelope_checks_run_in_the_documented_order():
    """docs/PROTOCOL.md §2: tlen 0 or 33 is `truncated`; a type's own maximum is checked after the
    signature, so an oversized heartbeat where another type is expected is `unexpected_type`."""
    from p2prl.crypto.envelope import MAGIC

    for tlen in (0, 33):
        raw = MAGIC + bytes([tlen]) + b"a" * 200
        with pytest.raises(EnvelopeError) as e:
            decode_message(raw, "n1")
        assert e.value.reason == "truncated"
    big = seal(TRAINER, "n1", "heartbeat", {"pad": "x" * (100 * 1024)})
    with pytest.raises(EnvelopeError) as e:
        decode_message(big, "n1", expected_type="verdict")
    assert e.value.reason == "unexpected_type"
    with pytest.raises(EnvelopeError) as e:
        decode_message(big, "n1")
    assert e.value.reason == "oversized"
    with pytest.raises(EnvelopeError) as e:
        decode_message(seal(TRAINER, "n1", "nosuchtype", {}), "n1")
    assert e.value.reason == "unknown_type"


def test_genesis_pinned_tolerances_are_optional_signed_and_bounded():
    """A genesis without pinned tolerances has no ``proof`` key (it is signed exactly as before); one
    with them round-trips; a value out of its bounds, a rung without its rate or a missing key is refused."""
    import copy
    import dataclasses

    from p2prl.protocol.examples import examples
    from p2prl.protocol.messages import Genesis, MessageError
    from p2prl.protocol.sections import ProofSpec, section_body

    g = next(ex.message for ex in examples() if isinstance(ex.message, Genesis))
    assert g.proof is None and "proof" not in g.to_body()
    spec = ProofSpec(6000, 50000, 50000, 500000, 2000, (500000, 250000), (1000, 20000), ("hf-cpu",), 8192)
    pinned = dataclasses.replace(g, proof=spec)
    assert Genesis.from_body(copy.deepcopy(pinned.to_body())) == pinned
    good = section_body(spec)
    for edit in (
        {"sampling_margin_ppm": 0},
        {"fingerprint_tol_ppm": 2_000_000},
        {"sampling_rung_rates_ppm": [1000]},
        {"sampling_rungs_ppm": [500000, 0]},
        {"engines": []},
        {"tokens": -1},
        {"logprob_tol_max_ppm": True},
    ):
        with pytest.raises(MessageError):
            Genesis.from_body(dict(g.to_body(), proof=dict(good, **edit)))
    with pytest.raises(MessageError):
        Genesis.from_body(dict(g.to_body(), proof={k: v for k, v in good.items() if k != "tokens"}))
