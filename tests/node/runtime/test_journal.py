"""The journal keeps the signed standing messages a node received and sent, verifiable again, bounded."""

from pathlib import Path

import pytest
from genesiskit import MODEL
from localnet import LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net import topic
from p2prl.node.runtime.journal import Journal, find_envelopes, journaled, read_journal
from p2prl.node.runtime.port import NetPort
from p2prl.node.setup.config import ConfigError, load_config
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.protocol import (
    GroupVerdict,
    Heartbeat,
    RolloutAnnouncement,
    Verdict,
    blob_ref_for,
    decode_message,
    encode_message,
)
from p2prl.store import BlobStore


def test_announcements_and_verdicts_in_and_out_are_journaled(tmp_path: Path) -> None:
    trainer, validator, miner = Identity.generate(), Identity.generate(), Identity.generate()
    sg = genesis_from_spec(NetworkSpec(network_id="net", validators=[validator.public_hex]), trainer, MODEL)
    hub = LocalHub(sg)
    m_port = journaled(hub.join(miner, BlobStore(tmp_path / "m")), tmp_path / "m", 1 << 20)
    v_port = journaled(hub.join(validator, BlobStore(tmp_path / "v")), tmp_path / "v", 1 << 20)
    assert isinstance(m_port, NetPort)  # the node's port still, wrapped
    ref = blob_ref_for(b"a batch")
    ann = encode_message(miner, "net", RolloutAnnouncement(3, "ab" * 32, ref, 8, "cd" * 32))
    m_port.publish(topic("net", "rollouts"), ann)
    m_port.publish(
        topic("net", "heartbeats"), encode_message(miner, "net", Heartbeat("miner", 3, "p", (), (), {}))
    )
    got = v_port.poll(timeout=1.0)
    assert [i.envelope.type for i in got] == ["rollout_announcement", "heartbeat"]
    verdict = Verdict(ref.id, miner.public_hex, 3, (GroupVerdict(0, True, "ok"),), announcement="ef" * 32)
    v_port.publish(topic("net", "verdicts"), encode_message(validator, "net", verdict))

    sent = list(read_journal(tmp_path / "m" / "journal"))
    assert [(r["dir"], r["type"]) for r in sent] == [("out", "rollout_announcement")]  # no heartbeats
    seen = list(read_journal(tmp_path / "v" / "journal"))
    assert [(r["dir"], r["type"], r["blob_id"]) for r in seen] == [
        ("in", "rollout_announcement", ref.id),
        ("out", "verdict", ref.id),
    ]
    (raw,) = find_envelopes(tmp_path / "v" / "journal", ref.id, "rollout_announcement")
    env, msg = decode_message(raw, "net")  # a record is the whole signed envelope: verifiable again
    assert env.signer == miner.public_key and msg.blob.id == ref.id and raw == ann
    (vraw,) = find_envelopes(tmp_path / "v" / "journal", ref.id, "verdict")
    assert decode_message(vraw, "net")[1] == verdict


def test_the_journal_stays_within_its_bound(tmp_path: Path) -> None:
    me = Identity.generate()
    j = Journal(tmp_path, 1 << 16)
    raw = encode_message(me, "net", RolloutAnnouncement(1, "ab" * 32, blob_ref_for(b"x"), 1, "cd" * 32))
    for _ in range(2000):  # ~1.5 MB of records into a 64 KiB journal
        j.record("in", raw)
    total = sum(p.stat().st_size for p in j.segments())
    assert total <= 1 << 16 and len(j.segments()) >= 2
    assert list(read_journal(tmp_path))[-1]["envelope"] == raw.hex()
    # a new journal over the same directory appends after what is there
    Journal(tmp_path, 1 << 16).record("out", raw)
    assert list(read_journal(tmp_path))[-1]["dir"] == "out"


def test_journal_setting_is_bounded_below() -> None:
    with pytest.raises(ConfigError, match="journal_bytes"):
        load_config(env={"P2PRL_JOURNAL_BYTES": "10", "P2PRL_NETWORK": "g"})
    assert load_config(env={"P2PRL_JOURNAL_BYTES": "65536", "P2PRL_NETWORK": "g"}).journal_bytes == 1 << 16


def test_a_node_started_with_journal_bytes_journals_what_it_publishes(make_net) -> None:
    """The hook: build_runtime wraps the libp2p host when --journal-bytes is set, and only then."""
    from p2prl.node.runtime.journal import JournaledPort
    from p2prl.node.runtime.startup import build_runtime

    net = make_net()
    rt = build_runtime(net.config("validator", journal_bytes=1 << 20))
    try:
        assert isinstance(rt.net, JournaledPort)
        ref = blob_ref_for(b"a batch")
        verdict = Verdict(ref.id, "ab" * 32, 0, (GroupVerdict(0, False, "sampling"),), announcement="ef" * 32)
        assert rt.publish("verdicts", verdict)
        (rec,) = read_journal(rt.config.data_dir / "journal")
        assert (rec["dir"], rec["type"], rec["blob_id"]) == ("out", "verdict", ref.id)
    finally:
        rt.net.stop()
    plain = build_runtime(net.config("miner1"))
    try:
        assert not isinstance(plain.net, JournaledPort) and not (plain.config.data_dir / "journal").exists()
    finally:
        plain.net.stop()
