"""``p2prl peers`` and ``p2prl blob get`` against a real node on 127.0.0.1."""

import json

import pytest
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.crypto.keys import Identity
from p2prl.net.config import NetConfig
from p2prl.net.node import P2PNode
from p2prl.protocol import PatchManifest, blob_ref_for, encode_message
from p2prl.store import BlobStore

NET = "clinet"


@pytest.fixture
def provider(tmp_path):
    node = P2PNode(Identity.generate(), NET, BlobStore(tmp_path / "prov"), NetConfig())
    node.start()
    yield node
    node.stop()


def test_peers_json_lists_the_dialled_node(provider) -> None:
    r = CliRunner().invoke(app, ["peers", "--connect", provider.addrs[0], "--json", "--wait", "0.2"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert [p["peer_id"] for p in info["peers"] if p["connected"]] == [provider.peer_id]
    bad = CliRunner().invoke(app, ["peers", "--connect", "/ip4/127.0.0.1/tcp/9/p2p/" + provider.peer_id])
    assert bad.exit_code == 1
    # what is wrong, in words: not libp2p's exception
    assert "nothing listens on 127.0.0.1:9 (connection refused)" in bad.output, bad.output
    assert "Error" not in bad.output and "Traceback" not in bad.output


def test_blob_get_from_signed_manifest_and_json_ref(provider, tmp_path) -> None:
    data = bytes(range(256)) * 2000
    ref = blob_ref_for(data, 64 * 1024)
    provider.store.put(data)
    trainer = Identity.generate()
    m = PatchManifest(1, 1, "", "ab" * 32, "anchor", "safetensors", ref, 1)
    (tmp_path / "m.env").write_bytes(encode_message(trainer, NET, m))
    (tmp_path / "ref.json").write_text(json.dumps(ref.to_body()))
    out = tmp_path / "out.bin"
    args = ["blob", "get", ref.id, "--peer", provider.addrs[0], "-o", str(out), "--timeout", "60"]
    r = CliRunner().invoke(app, [*args, "--manifest", str(tmp_path / "m.env"), "--network", NET])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == data
    out.unlink()
    r = CliRunner().invoke(app, [*args, "--manifest", str(tmp_path / "ref.json")])
    assert r.exit_code == 0 and out.read_bytes() == data
    # a signed manifest checked against the wrong network, or naming another blob, is refused
    r = CliRunner().invoke(app, [*args, "--manifest", str(tmp_path / "m.env"), "--network", "other"])
    assert r.exit_code == 1 and "bad_signature" in r.output
    r = CliRunner().invoke(
        app, ["blob", "get", "00" * 32, "--manifest", str(tmp_path / "ref.json"), "-o", str(out)]
    )
    assert r.exit_code == 1 and "names blob" in r.output


@pytest.mark.slow
def test_bench_fanout_small_prints_the_figures() -> None:
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "fanout",
            "--peers",
            "2",
            "--size-mib",
            "2",
            "--chunk-kib",
            "256",
            "--cap-mb-s",
            "4",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{") :])
    for k in (
        "peers",
        "blob_bytes",
        "publisher_upload_bytes",
        "all_verified",
        "seconds_all",
        "seconds_single",
        "cpu_seconds_single",
        "cpu_bound_seconds_all",
        "capped_two_over_one",
    ):
        assert k in res
    assert res["all_verified"] and res["cpu_seconds_all"] > 0 and res["cores"] >= 1
    # 2 MiB from a provider capped at 4 MB/s (burst 0.4 MB) takes at least 0.42 s
    assert 0 < res["capped_single_provider_MBps"] <= 4 * 1.35
    assert res["all_verified"] is True and res["peers"] == 2 and res["blob_bytes"] == 2 * 1024 * 1024
