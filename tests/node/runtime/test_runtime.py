"""The runtime runs a role through its typed door: the settings record it asks for, the pump with its
handlers, its loops, and a crash in a loop stops the node instead of leaving it half alive."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from genesiskit import MODEL
from localnet import LocalHub

from p2prl.crypto.keys import Identity
from p2prl.net import Incoming
from p2prl.node.runtime.pump import Handlers
from p2prl.node.runtime.role import Role
from p2prl.node.setup.netinit import NetworkSpec, genesis_from_spec
from p2prl.node.setup.settings import MinerSettings, ValidatorSettings
from p2prl.protocol import Scores, Verdict, decode_message, encode_message

NET = "runtime-net"
TRAINER, VALIDATOR, MINER = (Identity.generate() for _ in range(3))


class Probe:
    """A role that records what reaches it."""

    def __init__(self, crash: bool = False) -> None:
        self.verdicts: list[Incoming[Verdict]] = []
        self.ran = threading.Event()
        self.closed = False
        self.crash = crash

    def handlers(self) -> Handlers:
        return Handlers().on(Verdict, self.verdicts.append)

    def loops(self) -> dict[str, Callable[[], None]]:
        def loop() -> None:
            self.ran.set()
            if self.crash:
                raise RuntimeError("boom")

        return {"work": loop}

    def holds(self) -> list[str]:
        return []

    def head(self) -> int:
        return 0

    def pause(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def hub() -> LocalHub:
    spec = NetworkSpec(network_id=NET, validators=[VALIDATOR.public_hex])
    return LocalHub(genesis_from_spec(spec, TRAINER, MODEL))


def test_env_is_the_roles_own_record(tmp_path: Path) -> None:
    rt = hub().runtime("miner", MINER, tmp_path)
    env = rt.env(MinerSettings)
    assert isinstance(env.settings, MinerSettings) and env.network_id == NET and env.data_dir == tmp_path
    with pytest.raises(TypeError):
        rt.env(ValidatorSettings)  # a miner node has no validator settings to give


def test_the_pump_hands_each_handler_only_its_message_class(tmp_path: Path) -> None:
    h = hub()
    miner = h.runtime("miner", MINER, tmp_path / "m")
    validator = h.runtime("validator", VALIDATOR, tmp_path / "v")
    probe = Probe()
    assert isinstance(probe, Role)
    miner.start(probe)
    try:
        verdict = Verdict("ab" * 32, MINER.public_hex, 0, (), "cd" * 32)
        validator.outbox.publish("verdicts", Scores(0, 4, {MINER.public_hex: 3}))  # no handler: ignored
        validator.outbox.publish("verdicts", verdict)
        deadline = time.monotonic() + 10
        while not probe.verdicts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [i.message for i in probe.verdicts] == [verdict]
        assert probe.ran.wait(5)
    finally:
        miner.stop.set()
        assert miner.join(10)


def test_a_crashed_loop_stops_the_node(tmp_path: Path) -> None:
    rt = hub().runtime("miner", MINER, tmp_path)
    rt.start(Probe(crash=True))
    assert rt.stop.wait(10)
    assert rt.status.snapshot()["labelled"]["thread_crash"] == {"work": 1}
    assert rt.join(10)


def test_handlers_refuse_a_second_handler_and_a_body_of_another_class() -> None:
    seen: list[object] = []
    hs = Handlers().on(Verdict, seen.append)
    with pytest.raises(ValueError):
        hs.on(Verdict, seen.append)
    assert hs.types() == [Verdict.TYPE]
    env, msg = decode_message(encode_message(VALIDATOR, NET, Verdict("ab" * 32, MINER.public_hex, 0, (), "cd" * 32)), NET)
    item = Incoming("t", env, msg, "p", "p")
    assert hs.handler(item) is not None
    assert hs.handler(replace(item, message=Scores(0, 4, {}))) is None  # the envelope says verdict: not this body


def _write_full() -> None:
    """A write to a full disk: /dev/full where the system has it, else the error the OS raises."""
    if Path("/dev/full").is_char_device():
        with open("/dev/full", "wb") as f:  # every write: ENOSPC
            f.write(b"x" * 4096)
            f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "weights/v3.safetensors")


def test_a_full_disk_is_one_line_that_says_so_and_the_node_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write to a full disk stopped the node with a traceback and exit status 0; now one error line
    names the disk, and the runtime records the crash, so ``p2prl node`` exits 1."""
    from p2prl.node.runtime.runtime import disk_full

    class FullDisk(Probe):
        def loops(self) -> dict[str, Callable[[], None]]:
            return {"sync": _write_full}

    rt = hub().runtime("miner", MINER, tmp_path)
    with caplog.at_level("ERROR", logger="p2prl.node.runtime.runtime"):
        rt.start(FullDisk())
        assert rt.stop.wait(10)
        assert rt.join(10)
    assert rt.crashed == ["sync"]
    [rec] = [r for r in caplog.records if r.name == "p2prl.node.runtime.runtime"]
    assert "sync: no space left on device" in rec.getMessage() and "free disk space" in rec.getMessage()
    assert rec.exc_info is None
    # safetensors writes in native code and raises its own error with the OS's message
    native = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert disk_full(native) and not disk_full(RuntimeError("boom"))
