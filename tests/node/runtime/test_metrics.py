"""Metrics are declared once (p2prl/node/runtime/metrics.py): every name the package writes is declared with
the kind it is written as, a typo starts no series, and /metrics carries the declared help."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

import p2prl
from p2prl.node.runtime.metrics import METRICS, Kind
from p2prl.node.runtime.status import NodeStatus, make_registry

WRITERS = {"incr": Kind.COUNTER, "incr_label": Kind.LABELLED, "gauge": Kind.GAUGE, "gauge_max": Kind.GAUGE}
WRITE = re.compile(r"\.(incr_label|incr|gauge_max|gauge)\(\s*(f?)\"([^\"]+)\"")


def _writes() -> list[tuple[str, str, bool, str]]:
    """(writer, name, is an f-string, where) for every status write with a literal name."""
    root = Path(p2prl.__file__).parent
    out = []
    for path in sorted(root.rglob("*.py")):
        for m in WRITE.finditer(path.read_text()):
            out.append((m[1], m[3], m[2] == "f", str(path.relative_to(root))))
    return out


def test_every_metric_the_package_writes_is_declared_as_written() -> None:
    writes = _writes()
    assert len(writes) > 50  # the scan sees the roles' writes
    wrong = []
    for writer, name, is_f, where in writes:
        kind = WRITERS[writer]
        if is_f:  # f"net_{k}": a declared family of that kind
            prefix = name.split("{", 1)[0]
            ok = any(n.startswith(prefix) and m.kind is kind for n, m in METRICS.items())
        else:
            ok = name in METRICS and METRICS[name].kind is kind
        if not ok:
            wrong.append((where, writer, name))
    assert not wrong, f"undeclared (or declared as another kind) in p2prl/node/runtime/metrics.py: {wrong}"


def test_a_typo_starts_no_series_and_is_counted() -> None:
    s = NodeStatus("validator", "ab" * 32, "net")
    s.incr("rollouts_acepted", 3)  # typo
    s.gauge("rollouts_accepted", 1.0)  # a counter written as a gauge
    s.incr_label("rejectd", "fingerprint")
    s.incr("rollouts_accepted", 2)
    snap = s.snapshot()
    assert snap["counters"] == {"rollouts_accepted": 2}
    assert snap["gauges"] == {}
    assert snap["labelled"] == {
        "undeclared_metric": {"counter:rollouts_acepted": 1, "gauge:rollouts_accepted": 1, "labelled:rejectd": 1}
    }


def test_prometheus_help_is_the_declared_help() -> None:
    s = NodeStatus("validator", "ab" * 32, "net")
    s.incr("rollouts_accepted", 2)
    s.incr_label("rejected", "fingerprint")
    s.gauge("net_bytes_up", 10)
    text = generate_latest(make_registry(s)).decode()
    for name, suffix in (("rollouts_accepted", "_total"), ("rejected", "_total"), ("net_bytes_up", "")):
        assert f"# HELP p2prl_{name}{suffix} {METRICS[name].help}" in text, text
