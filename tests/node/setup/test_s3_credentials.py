"""Item 20 of docs/SECURITY.md: a genesis names the S3 endpoint; credentials in a volunteer's
environment must not sign requests to it unless the operator configured that endpoint to be signed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from genesiskit import MODEL

from p2prl.crypto.keys import Identity
from p2prl.net.s3 import S3Mirror
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.node.setup.netsettings import s3_config


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str]]]:
    """An HTTP endpoint that answers 404 to everything and records each Authorization header."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = _any

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


def read_once(tmp_path: Path, endpoint: str, **cfg: object) -> None:
    spec = NetworkSpec(network_id="net-a", s3_endpoint=endpoint, s3_bucket="bucket")
    sg = genesis_from_spec(spec, Identity.generate(), MODEL)
    node_cfg = NodeConfig(role="miner", network=tmp_path / "g.json", **cfg)  # type: ignore[arg-type]
    S3Mirror(s3_config(node_cfg, sg), "net-a").has_blob("00" * 32)


def test_genesis_endpoint_gets_no_credentials(tmp_path, recorder, monkeypatch) -> None:
    url, seen = recorder
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAVOLUNTEER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "volunteer-secret")
    read_once(tmp_path, url)
    read_once(tmp_path, url, s3_sign=True)  # signing asked for, but this endpoint came from genesis
    assert seen and not any(seen)


def test_operator_endpoint_signed_only_when_asked(tmp_path, recorder, monkeypatch) -> None:
    url, seen = recorder
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOPERATOR")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    read_once(tmp_path, "http://elsewhere.invalid", s3_endpoint=url)
    assert seen and not any(seen)
    seen.clear()
    read_once(tmp_path, "http://elsewhere.invalid", s3_endpoint=url, s3_sign=True)
    assert seen and all("AKIAOPERATOR" in h for h in seen)
