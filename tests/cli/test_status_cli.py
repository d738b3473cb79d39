"""``p2prl status URL`` against a real node status server, and the transfer progress bar."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.cli.progress import transfer_progress
from p2prl.node.runtime.http import StatusServer
from p2prl.node.runtime.status import NodeStatus


@pytest.fixture
def validator():
    s = NodeStatus("validator", "dd" * 32, "statusnet")
    s.set(version=5, trainer_version=7, peers=3, sync_state="fetching", weights_hash="ab" * 32)
    s.incr("groups_accepted", 30)
    s.incr("groups_rejected", 10)
    s.incr_label("rejected", "fingerprint", 10)
    s.set_scores({"bb" * 32: 30})
    s.add_reward(5, 3.0, 10)
    s.gauge("net_bytes_down", 3 * 1024 * 1024)
    s.gauge("net_bytes_s3", 5 * 1024)
    s.transfer("cc" * 32, 25, 100)
    server = StatusServer(s).start()
    yield server
    server.stop()


def test_status_summarizes_a_node(validator) -> None:
    r = CliRunner().invoke(app, ["status", validator.url])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "validator dddddddddddddddd" in out and "statusnet" in out
    assert "5 (trainer at 7, lag 2)" in out and "fetching" in out and "abababab" in out
    assert "down 3.0 MiB (+5.0 KiB from S3)" in out
    assert "accepted 30, rejected 10" in out and "fingerprint 10" in out and "bbbbbbbb" in out
    assert "0.300 at version 5" in out and "25% of 100 B" in out
    # host:port works too, and --json is the endpoint's own document
    r = CliRunner().invoke(app, ["status", validator.url.split("//")[1], "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["scores"] == {"bb" * 32: 30}


def test_status_of_a_dead_node_fails_cleanly() -> None:
    from p2prl.net.ports import free_port

    r = CliRunner().invoke(app, ["status", f"http://127.0.0.1:{free_port()}", "--timeout", "2"])
    assert r.exit_code == 1 and "did not answer" in r.output


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=100, force_terminal=False), buf


def test_transfer_progress_completes_only_on_success() -> None:
    console, buf = _console()
    with transfer_progress("blob abc", 2048, console=console) as on_progress:
        on_progress(512, 2048)
        on_progress(1024, 4096)  # the size learnt on the way
    assert "blob abc" in buf.getvalue() and "4.1/4.1 kB" in buf.getvalue()

    console, buf = _console()
    with pytest.raises(TimeoutError), transfer_progress("blob def", 4096, console=console) as on_progress:
        on_progress(1024, 4096)
        raise TimeoutError
    assert "1.0/4.1 kB" in buf.getvalue()


def test_status_takes_a_data_directory(validator, tmp_path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    r = CliRunner().invoke(app, ["status", str(d)])
    assert r.exit_code == 1 and "no readable status.port" in r.output
    (d / "status.port").write_text(f"{validator.port}\n")
    r = CliRunner().invoke(app, ["status", str(d), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["role"] == "validator"
