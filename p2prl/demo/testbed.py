"""``p2prl demo --testbed``: the demo's network with every node on its own testbed host.

Trainer, validator and miners each run in a host with rate-limited links (``link_mbit`` each way);
the last ``nat_miners`` miners sit behind their own NAT routers. Everyone knows only the trainer
(the one bootstrap peer) and finds the others from heartbeats; the trainer is also the relay for
NATed miners. The network is peer to peer only: the demo's S3 endpoint lives outside the testbed.
With ``churn_s`` a miner is killed that long after the start (once versions flow: at v2 or later)
and started again with the same key and store ``churn_down_s`` later: it must be back on the
trainer's version within two versions of its return.

The keys, genesis and node flags are the demo's own (``p2prl/demo/launcher.py``); only where the
processes run and how their status pages are read differ: each status page listens on 127.0.0.1
inside its host, so it is read from a thread that entered that host's namespace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from p2prl.crypto import load_or_create_identity
from p2prl.dashboard import fetch_status
from p2prl.demo import launcher as d
from p2prl.demo.supervisor import Child, Supervisor, node_command
from p2prl.net import peer_id_for
from p2prl.testbed import HostSpec, Testbed, enter


def fetch_in(ns: str, url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A status page inside namespace ``ns`` (a network namespace is per thread: enter it in one)."""
    box: list[dict[str, Any] | None] = [None]

    def run() -> None:
        try:
            enter(ns)
            box[0] = fetch_status(url, timeout=timeout)
        except Exception:
            box[0] = None

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout + 1.0)
    return box[0]


def _args_on(args: list[str], listen: str, bootstrap: str, relay: bool) -> list[str]:
    """The demo's flags for one node, listening on its testbed address and bootstrapping from the
    trainer's (the genesis names the trainer's loopback address, unreachable from a host)."""
    out = list(args)
    out[out.index("--listen") + 1] = listen
    out += ["--bootstrap", bootstrap]
    return out + (["--relay-service"] if relay else [])


def run_demo_testbed(
    opts: Any,
    link_mbit: float = 50.0,
    nat_miners: int = 1,
    churn_s: float = 0.0,
    churn_down_s: float = 10.0,
    tag: str | None = None,
) -> dict[str, Any]:
    """Run the demo on a testbed for ``opts.duration`` seconds; returns the demo's summary plus
    ``links`` (bytes each host's link carried), ``peers`` (connected peers per node at the end),
    ``nat_miners`` and, with churn, ``churn``."""
    names = d._nodes(opts)
    miners = [n for n in names if n.startswith("miner")]
    natted = miners[len(miners) - nat_miners :] if nat_miners else []
    specs = [HostSpec(n, link_mbit, link_mbit, nat=f"r{n}" if n in natted else None) for n in names]
    root = Path(opts.workdir or tempfile.mkdtemp(prefix="p2prl-tbdemo-"))
    root.mkdir(parents=True, exist_ok=True)
    tb = Testbed(specs, tag=tag) if tag else Testbed(specs)
    sup = Supervisor(root)
    summary: dict[str, Any] = {}
    with tb:
        try:
            plan = d.prepare(opts, root, "")
            ids = {n: peer_id_for(load_or_create_identity(root / n / "node.key")) for n in names}
            trainer_addr = f"{tb.hosts['trainer'].listen(plan['trainer_port'])}/p2p/{ids['trainer']}"

            def spawn(name: str) -> Child:
                h = tb.hosts[name]
                port = plan["trainer_port"] if name == "trainer" else 0
                args = _args_on(
                    d._node_args(opts, root, plan, name, ""), h.listen(port), trainer_addr, name == "trainer"
                )
                logs = root / "logs"
                logs.mkdir(parents=True, exist_ok=True)
                f = open(logs / f"{name}.log", "ab")  # noqa: SIM115 (closed by stop_all)
                argv, env = node_command(d.S3_ENV)
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", h.ns, *argv, *args],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
                child = Child(name, proc, logs / f"{name}.log", f)
                sup.children.append(child)
                return child

            def statuses() -> dict[str, dict[str, Any] | None]:
                return {n: fetch_in(tb.hosts[n].ns, d._url(plan, n)) for n in names}

            for n in names:
                spawn(n)
            d.wait_up(sup, statuses, opts.startup_timeout_s, threading.Event())
            summary = _run(opts, sup, spawn, statuses, names, churn_s, churn_down_s)
            final = summary.pop("_statuses")
            summary.update(d.summarize(plan, final, names))
            summary["peers"] = {n: int((s or {}).get("peers", 0)) for n, s in final.items()}
        except (RuntimeError, ValueError, OSError) as e:
            summary = {"error": str(e)}
        finally:
            summary["exit_codes"] = sup.stop_all(grace_s=60.0)  # a role finishes its fetch first
            summary["links"] = {n: tb.link_bytes(n) for n in names}
            summary["nat_miners"] = natted
            summary["link_mbit"] = link_mbit
    if opts.summary_json is not None:
        Path(opts.summary_json).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _version(s: dict[str, Any] | None) -> int:
    return int((s or {}).get("version", -1))


def _track(churn: dict[str, Any], st: dict[str, Any], victim: str, since_restart_s: float) -> None:
    """After the restart: when the miner is up again (it loaded the weights it saved) and
    when it is back in sync (on the trainer's version, or one behind while it fetches the newest one)."""
    if "restarted_at_version" not in churn or "back_at_version" in churn:
        return
    tv, mv = _version(st.get("trainer")), _version(st.get(victim))
    loaded = bool((st.get(victim) or {}).get("weights_hash"))  # its status page answers before that
    if loaded and "up_at_version" not in churn:
        churn["up_at_version"] = tv
        churn["up_after_s"] = round(since_restart_s, 1)
    if loaded and mv >= tv - 1:
        churn["back_at_version"] = tv
        churn["back_after_s"] = round(since_restart_s, 1)
        churn["back_while_publishing"] = not (st.get("trainer") or {}).get("paused", False)


def _run(
    opts: Any, sup: Any, spawn: Any, statuses: Any, names: list[str], churn_s: float, churn_down_s: float
) -> dict[str, Any]:
    """Progress lines, the churn of one miner, then the demo's quiesce-and-catch-up ending."""
    out: dict[str, Any] = {}
    victim = next(n for n in names if n.startswith("miner"))
    churn: dict[str, Any] = {}
    start = killed = time.monotonic()
    end = start + float(opts.duration or 60.0)
    next_line = start
    # with churn, go on past the duration (up to 90 s) until the miner is back, so its return is
    # measured while versions are still published
    while time.monotonic() < end or (
        churn_s and "back_at_version" not in churn and time.monotonic() < end + 90
    ):
        now = time.monotonic()
        for c in sup.children:
            if not c.alive and not (churn and c.name == victim and "back_at_version" not in churn):
                raise RuntimeError(f"{c.name} exited with {c.proc.returncode}:\n{c.tail()}")
        st = statuses() if now >= next_line or churn_s else {}
        if now >= next_line:
            print(d.progress_line(now - start, st, names), flush=True)
            next_line = now + opts.progress_s
        if churn_s and not churn and now - start >= churn_s and _version(st.get("trainer")) >= 2:
            sup.get(victim).proc.send_signal(signal.SIGKILL)  # while versions flow: partials stay
            sup.get(victim).proc.wait(10)
            killed = now
            churn = {
                "killed_at_version": _version(st.get("trainer")),
                "killed_after_s": round(now - start, 1),
            }
        elif churn and "restarted_at_version" not in churn and now - killed >= churn_down_s:
            sup.children.remove(sup.get(victim))
            spawn(victim)
            churn["restarted_at_version"] = _version(st.get("trainer"))
        else:
            _track(churn, st, victim, now - killed - churn_down_s)
        time.sleep(1.0)
    sup.signal("trainer", signal.SIGUSR1)  # quiesce: stop publishing, keep serving
    deadline = time.monotonic() + opts.catch_up_s
    st = statuses()
    last = None
    while time.monotonic() < deadline:
        st = statuses()
        _track(churn, st, victim, time.monotonic() - killed - churn_down_s)
        now_settled = d.settled(st, [m for m in names if m.startswith("miner")])
        meshed = all(int((x or {}).get("peers", 0)) >= len(names) - 1 for x in st.values())
        if now_settled is not None and now_settled == last and meshed:  # a restarted miner re-finds all
            break
        last = now_settled
        time.sleep(1.0)
    if churn:
        out["churn"] = {"miner": victim, **churn}
    out["_statuses"] = st
    return out
