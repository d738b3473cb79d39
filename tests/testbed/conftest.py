"""Fixtures: testbeds of real namespaces (skipped, with the reason, where they cannot be made)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from p2prl.bench.peerproc import PeerProcess
from p2prl.testbed.bed import HostSpec, Testbed
from p2prl.testbed.netns import nat_unavailable_reason, unavailable_reason


@pytest.fixture(scope="session")
def namespaces_ok() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"testbed unavailable: {reason}")


@pytest.fixture(scope="session")
def nat_ok(namespaces_ok: None) -> None:
    reason = nat_unavailable_reason()
    if reason:
        pytest.skip(f"testbed NAT unavailable: {reason}")


@pytest.fixture
def make_testbed(namespaces_ok: None) -> Iterator[Callable[[list[HostSpec]], Testbed]]:
    """Brings testbeds up; afterwards checks that tearing them down left no namespace behind."""
    beds: list[Testbed] = []

    def make(specs: list[HostSpec]) -> Testbed:
        tb = Testbed(specs).up()
        beds.append(tb)
        return tb

    yield make
    for tb in beds:
        tb.down()
        assert tb.namespaces() == [], f"testbed {tb.tag} leaked {tb.namespaces()}"


@pytest.fixture
def peer_on(tmp_path: Path) -> Iterator[Callable[..., PeerProcess]]:
    """Starts a node process inside a testbed host, listening on the host's address."""
    procs: list[PeerProcess] = []

    def start(tb: Testbed, host: str, store: str = "", **opts: Any) -> PeerProcess:
        h = tb.hosts[host]
        p = PeerProcess(
            str(tmp_path / (store or f"{host}-{len(procs)}")), netns=h.ns, listen=h.listen(), **opts
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()
