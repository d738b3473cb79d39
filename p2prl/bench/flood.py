"""``p2prl bench flood``: honest batches judged per minute, and their latency, under an announcement flood.

A real trainer (pump and fetch threads) and a real validator (pump, fetch and judging threads) on
127.0.0.1; honest miners' genuine batches are announced at a steady pace from the host that serves
them. Each phase runs ``seconds``: first without attackers, then with attacker hosts, each in its
own process and connected to the validator and the miner host, that publish announcements at 90% of
the per-peer gossip limit signed by a pool of fresh keys: half name blobs nobody serves, half squat
the latest honest announcement they have seen. A batch counts as judged when
the trainer has released it for training on the validator's verdict; latency is from announcement to
that moment.

``processes`` runs the trainer and the validator each in a process of its own (as ``p2prl demo``
runs them), so each node's transport has an interpreter to itself: the batches are mined, then
the in-process trainer and validator are stopped and the same nodes (keys, data, ports) started
again as child processes; a batch counts as judged when the trainer's process releases it.

``many_keys`` is the many-key case (docs/SECURITY.md §25): a fresh key for every flood announcement,
each naming a junk blob the validator holds, so every one can be fetched and judged (a hard failure
each, an entry each in the judged memory, shrunk to ``JUDGED_SHRUNK`` so the flood overflows it
within seconds), alternating with replays of the honest batches already judged, re-signed by their
miners as a replay past the gossip guard would arrive. Besides the honest rate it reports the honest
miners whose score fell to 0 (a replay judged again fails as a duplicate).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2prl.bench.arena import NETWORK, Arena, make_arena
from p2prl.crypto.keys import Identity
from p2prl.net import topic
from p2prl.net.config import Limits
from p2prl.protocol.blobs import blob_ref_for
from p2prl.protocol.messages import RolloutAnnouncement, encode_message


def _role_process(root: str, model_cache: str, name: str, listen: str, dial: list[str]) -> None:
    """One role (``trainer``: its pump and one fetch loop, no training; ``validator``: all of it) of
    the arena's node ``name`` in its own process. Writes ``<name>.addr`` once up; the trainer appends
    each batch it releases (``signer blob wall-time``) to ``released.log``; on ``stop`` it writes
    ``<name>.json`` (its status, and the validator's scores) and exits."""
    from p2prl.node.runtime.startup import build_runtime
    from p2prl.node.setup.config import NodeConfig
    from p2prl.node.setup.settings import TrainerSettings, ValidatorSettings

    d = Path(root)
    role = name.rstrip("0123456789")
    rt = build_runtime(
        NodeConfig(
            role=role,  # type: ignore[arg-type]
            network=d / "genesis.json",
            data_dir=d / name,
            listen=listen,
            model_cache=Path(model_cache),
            s3_enable=False,
            status_port=-1,
        )
    )
    try:
        if role == "trainer":
            from p2prl.node.trainer.trainer import Trainer

            obj: Any = Trainer(rt.env(TrainerSettings))
            rt.start(obj, only={"fetch0"})
        else:
            from p2prl.node.validator.validator import Validator

            obj = Validator(rt.env(ValidatorSettings))
            if hasattr(obj, "wait_calibrated"):  # judged with the tolerances a settled validator has
                obj.wait_calibrated()
            rt.start(obj)
        for addr in dial:
            rt.net.connect(addr)
        (d / f"{name}.addr").write_text(f"{rt.net.addrs[0]}/p2p/{rt.net.peer_id}")
        seen: set[tuple[str, str]] = set()
        with open(d / "released.log", "a") as out:
            while not (d / "stop").exists():
                if role == "trainer":
                    with obj.intake.lock:
                        done = [k for k, v in obj.intake.policy.done.items() if not v and k not in seen]
                    for k in done:
                        seen.add(k)
                        out.write(f"{k[0]} {k[1]} {time.time()}\n")
                    out.flush()
                time.sleep(0.05)
        snap: dict[str, Any] = dict(rt.status.snapshot())
        stats = rt.net.stats()
        snap["gossip"] = {k: v for k, v in stats.items() if k == "gossip_in" or k.startswith("dropped.")}
        if role == "validator":
            snap["miner_scores"] = obj.scores.scores(obj.current.version)
        (d / f"{name}.json").write_text(json.dumps(snap, default=str))
    finally:
        rt.stop.set()
        rt.join(10, warn=False)
        rt.net.stop()


def _start_roles(a: Arena) -> None:
    """The validator's pump and judging loop, the trainer's pump and fetch loop (no training)."""
    a.validator_rt().start(a.validator)
    a.trainer_rt.start(a.trainer, only={"fetch0"})


def _released(t: Any, key: tuple[str, str]) -> bool:
    with t.intake.lock:
        return key in t.intake.policy.done and not t.intake.policy.done[key]


def _junk(n: int, squat: RolloutAnnouncement | None) -> RolloutAnnouncement:
    """The ``n``-th flood announcement: odd ones re-sign ``squat`` (an honest miner's), even ones name
    a blob nobody serves."""
    if n % 2 and squat is not None:
        return dataclasses.replace(squat, created_ms=squat.created_ms + n)
    return RolloutAnnouncement(
        version=0,
        manifest_hash="00" * 32,
        blob=blob_ref_for(os.urandom(4096), chunk_size=64 * 1024),
        groups=2,
        commitment_root="00" * 32,
    )


def _attack(
    root: str,
    model_cache: str,
    n: int,
    keys: int,
    rate: float,
    seconds: float,
    dial: list[str],
    signal: bool = False,
) -> None:
    """One attacker host, in its own process: junk announcements at ``rate`` per second from ``keys``
    keys for ``seconds``; every second one squats the latest honest announcement it has seen.
    ``signal``: write ``attacker<n>.ready`` once flooding, stop when ``stop_flood`` exists, and write
    the count sent to ``attacker<n>.sent``."""
    from p2prl.node.runtime.startup import build_runtime
    from p2prl.node.setup.config import NodeConfig

    rt = build_runtime(
        NodeConfig(
            role="miner",
            network=Path(root) / "genesis.json",
            data_dir=Path(root) / f"attacker{n}",
            listen="/ip4/127.0.0.1/tcp/0",
            model_cache=Path(model_cache),
            s3_enable=False,
            status_port=-1,
        )
    )
    ids = [Identity.generate() for _ in range(keys)]
    mine = {i.public_key for i in ids}
    rollouts = topic(NETWORK, "rollouts")
    latest: RolloutAnnouncement | None = None
    try:
        for addr in dial:
            rt.net.connect(addr)
        time.sleep(2.0)
        t0, sent = time.monotonic(), 0
        stop = Path(root) / "stop_flood"
        if signal:
            (Path(root) / f"attacker{n}.ready").write_text("")
        while time.monotonic() - t0 < seconds and not (signal and sent % 16 == 0 and stop.exists()):
            for item in rt.net.poll(timeout=0):
                if item.envelope.type == RolloutAnnouncement.TYPE and item.envelope.signer not in mine:
                    latest = item.message
            ann = _junk(sent, latest)
            try:
                rt.net.publish(rollouts, encode_message(ids[sent % keys], NETWORK, ann))
            except Exception:
                pass
            sent += 1
            time.sleep(max(0.0, t0 + sent / rate - time.monotonic()))
        if signal:
            (Path(root) / f"attacker{n}.sent").write_text(f"{sent} {time.monotonic() - t0:.1f}")
    finally:
        rt.net.stop()


def _inject(
    a: Arena,
    rate: float,
    keys: int,
    latest: list[RolloutAnnouncement],
    stop: threading.Event,
    counts: list[int],
) -> None:
    """The same flood delivered straight to the validator's and trainer's handlers, as their pumps
    would at ``rate`` per second: the roles' own limits under full load, whatever gossip lets through."""
    from p2prl.bench.arena import delivered

    ids = [Identity.generate() for _ in range(keys)]
    t0, sent = time.monotonic(), 0
    while not stop.is_set():
        item = delivered(ids[sent % keys], _junk(sent, latest[-1]))
        a.validator.on_announcement(item)
        a.trainer.intake.on_announcement(item)
        sent += 1
        stop.wait(max(0.0, t0 + sent / rate - time.monotonic()))
    counts.append(sent)


JUDGED_SHRUNK = 64


def _inject_many(
    a: Arena,
    rate: float,
    honest: list[tuple[Identity, RolloutAnnouncement]],
    stop: threading.Event,
    counts: list[int],
) -> None:
    """The many-key flood, straight to the handlers at ``rate`` per second: a fresh key per junk batch
    the validator holds, every second item a replay of an honest batch already announced."""
    from p2prl.bench.arena import delivered

    t0, sent = time.monotonic(), 0
    while not stop.is_set():
        if sent % 2 and len(honest) > 1:
            miner, ann = honest[(sent // 2) % (len(honest) - 1)]  # not the newest: it may be in flight
            item = delivered(miner, dataclasses.replace(ann, created_ms=ann.created_ms + 1 + sent))
        else:
            junk = os.urandom(4096)
            ref = blob_ref_for(junk, chunk_size=64 * 1024)
            a.validator.env.store.put(junk, expected_id=ref.id)
            ann = dataclasses.replace(honest[-1][1], blob=ref)
            item = delivered(Identity.generate(), ann)
        a.validator.on_announcement(item)
        a.trainer.intake.on_announcement(item)
        sent += 1
        stop.wait(max(0.0, t0 + sent / rate - time.monotonic()))
    counts.append(sent)


def _phase(
    a: Arena,
    batches: list[tuple[Identity, RolloutAnnouncement]],
    seconds: float,
    every: float,
    sent_log: list[RolloutAnnouncement] | None = None,
    sent_by: list[tuple[Identity, RolloutAnnouncement]] | None = None,
) -> dict[str, Any]:
    """Announce every one of ``batches``, one each ``every`` s; judged per minute of ``seconds`` and
    latencies. Each is announced, however late: a mined batch left unannounced would be a gap in
    its miner's prompt indices, and the validator would rightly reject the miner's later batches of
    the version (``index_gap``)."""
    t, host = a.trainer, a.miner_host
    rollouts = topic(NETWORK, "rollouts")
    sent: dict[tuple[str, str], float] = {}
    lat: dict[tuple[str, str], float] = {}
    t0 = time.monotonic()
    i = 0
    while i < len(batches):
        miner, ann = batches[i]
        key = (miner.public_hex, ann.blob.id)
        host.net.publish(rollouts, encode_message(miner, NETWORK, ann))
        sent[key] = time.monotonic()
        if sent_log is not None:
            sent_log.append(ann)
        if sent_by is not None:
            sent_by.append((miner, ann))
        i += 1
        nxt = t0 + i * every
        while time.monotonic() < nxt:
            for k, s in sent.items():
                if k not in lat and _released(t, k):
                    lat[k] = time.monotonic() - s
            time.sleep(0.02)
    end = time.monotonic() + 10.0  # latecomers announced near the end
    while time.monotonic() < end and len(lat) < len(sent):
        for k, s in sent.items():
            if k not in lat and _released(t, k):
                lat[k] = time.monotonic() - s
        time.sleep(0.05)
    return _latencies(len(sent), list(lat.values()), seconds)


@dataclasses.dataclass(frozen=True)
class FloodSpec:
    seconds: float = 30.0  # each phase
    every: float = 1.5  # seconds between honest announcements
    miners: int = 4  # honest keys
    attackers: int = 2  # attacker processes, each at 90% of the per-peer gossip limit
    keys: int = 500  # signing keys per attacker
    inject: bool = False  # deliver the flood straight to the roles' handlers instead of by gossip
    many_keys: bool = False  # the many-key case (judged junk from fresh keys, honest replays); injected
    processes: bool = False  # the trainer and the validator each in a process of its own (by gossip only)


def _sent_phase(
    a: Arena, batches: list[tuple[Identity, RolloutAnnouncement]], every: float
) -> dict[tuple[str, str], float]:
    """Announce each of ``batches`` from the miner host, one each ``every`` s; their wall-clock times."""
    rollouts = topic(NETWORK, "rollouts")
    sent: dict[tuple[str, str], float] = {}
    t0 = time.monotonic()
    for i, (miner, ann) in enumerate(batches):
        a.miner_host.net.publish(rollouts, encode_message(miner, NETWORK, ann))
        sent[(miner.public_hex, ann.blob.id)] = time.time()
        time.sleep(max(0.0, t0 + (i + 1) * every - time.monotonic()))
    return sent


def _summary(sent: dict[tuple[str, str], float], released: dict[tuple[str, str], float], seconds: float) -> dict[str, Any]:
    return _latencies(len(sent), [released[k] - t for k, t in sent.items() if k in released], seconds)


def _latencies(announced: int, latencies: list[float], seconds: float) -> dict[str, Any]:
    """A phase's figures: batches announced and judged, the judged rate, latency p50/p95."""
    ls = sorted(latencies)
    return {
        "announced": announced,
        "judged": len(ls),
        "per_minute": len(ls) * 60.0 / seconds,
        "latency_p50_s": statistics.median(ls) if ls else None,
        "latency_p95_s": ls[int(0.95 * (len(ls) - 1))] if ls else None,
    }


def _wait_file(path: Path, timeout: float, procs: list[Any]) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if any(not p.is_alive() for p in procs):
            raise RuntimeError(f"a role process exited before writing {path.name}")
        time.sleep(0.2)
    raise TimeoutError(f"{path.name} not written in {timeout:.0f} s")


def run_processes(model_cache: Path, spec: FloodSpec, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The gossip flood with the trainer and the validator each in a process of its own."""
    seconds, every, miners, attackers, keys = spec.seconds, spec.every, spec.miners, spec.attackers, spec.keys
    rate = 0.9 * Limits().peer_msgs_per_s
    n = math.ceil(seconds / every)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="p2prl-flood-") as tmp:
        root = Path(tmp)
        a = make_arena(root, model_cache, validators=1, hosts=1)
        procs: list[Any] = []
        try:
            honest = [Identity.generate() for _ in range(miners)]
            log(f"mining {2 * n + miners} honest batches ...")
            warm = [(m, a.mine(m)[1]) for m in honest]
            plain = [(honest[k % miners], a.mine(honest[k % miners])[1]) for k in range(n)]
            flooded = [(honest[k % miners], a.mine(honest[k % miners])[1]) for k in range(n)]
            host = a.miner_host
            here = f"{host.net.addrs[0]}/p2p/{host.net.peer_id}"
            listens = {"trainer": a.trainer_rt.config.listen, "validator0": "/ip4/127.0.0.1/tcp/0"}
            for rt in a.runtimes[:2]:  # the same nodes, started again each in its own process
                rt.stop.set()
                rt.net.stop()
            a.runtimes = a.runtimes[2:]  # the miner host stays here
            log("starting the trainer and the validator, each in its own process ...")
            for name in ("trainer", "validator0"):
                procs.append(
                    ctx.Process(target=_role_process, args=(tmp, str(model_cache), name, listens[name], [here]))
                )
                procs[-1].start()
            addrs = {name: _wait_file(root / f"{name}.addr", 600, procs) for name in listens}
            for addr in addrs.values():
                host.net.connect(addr)
            time.sleep(3.0)  # gossip meshes form on the heartbeat after connecting
            log("warm-up: each honest miner's first batch")
            sent = _sent_phase(a, warm, 0.5)
            time.sleep(5.0)
            log(f"phase 1: no flood, {seconds:.0f} s")
            base_sent = _sent_phase(a, plain, every)
            time.sleep(10.0)  # latecomers
            attack = [
                ctx.Process(
                    target=_attack,
                    args=(tmp, str(model_cache), k, keys, rate, 3600.0, [addrs["validator0"], here], True),
                    daemon=True,
                )
                for k in range(attackers)
            ]
            for p in attack:
                p.start()
            for k in range(attackers):  # each flooding before the phase starts
                _wait_file(root / f"attacker{k}.ready", 600, attack)
            log(f"phase 2: {attackers} flooders (attacker processes, by gossip) at {rate:.0f} msg/s each, {keys} keys each")
            time.sleep(6.0)
            flood_sent = _sent_phase(a, flooded, every)
            (root / "stop_flood").write_text("")
            for p in attack:
                p.join(30)
                if p.is_alive():
                    p.kill()
            time.sleep(10.0)
            (root / "stop").write_text("")
            for name in listens:
                _wait_file(root / f"{name}.json", 60, [])
            released: dict[tuple[str, str], float] = {}
            for line in (root / "released.log").read_text().splitlines():
                signer, blob, t = line.split()
                released.setdefault((signer, blob), float(t))
            vs = json.loads((root / "validator0.json").read_text())
            flood_sent_n = [(root / f"attacker{k}.sent").read_text() for k in range(attackers) if (root / f"attacker{k}.sent").exists()]
            ts = json.loads((root / "trainer.json").read_text())
        finally:
            (root / "stop").write_text("")
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
            a.close()
    base, under = _summary(base_sent, released, seconds), _summary(flood_sent, released, seconds)
    scores = vs.get("miner_scores", {})
    return {
        "seconds": seconds,
        "every_s": every,
        "miners": miners,
        "attackers": attackers,
        "keys_per_attacker": keys,
        "inject": False,
        "many_keys": False,
        "processes": True,
        "warm_judged": sum(1 for k in sent if k in released),
        "honest_miners_zeroed": sum(1 for m in honest if scores.get(m.public_hex, 0) == 0),
        "judged_forgotten": 0,
        "injected": 0,
        "flood_msgs_per_s": rate * attackers,
        "no_flood": base,
        "flood": under,
        "ratio": under["per_minute"] / base["per_minute"] if base["per_minute"] else 0.0,
        "validator_dropped": vs["labelled"].get("dropped", {}),
        "validator_rejected": vs["labelled"].get("rejected", {}),
        "trainer_dropped": ts["labelled"].get("dropped", {}),
        "gossip_in_per_s_under_flood": {},
        "gossip": {"validator": vs.get("gossip", {}), "trainer": ts.get("gossip", {})},
        "attackers_sent": flood_sent_n,  # "<announcements> <seconds>" per attacker
        "validator_batches_checked": vs.get("counters", {}).get("batches_checked"),
    }


def run(model_cache: Path, spec: FloodSpec, log: Callable[[str], None] = print) -> dict[str, Any]:
    if spec.processes:
        return run_processes(model_cache, spec, log)
    seconds, every, miners, attackers, keys, inject, many_keys, _ = dataclasses.astuple(spec)
    inject = inject or many_keys
    rate = 0.9 * Limits().peer_msgs_per_s
    n = math.ceil(seconds / every)  # the batches one phase announces
    with tempfile.TemporaryDirectory(prefix="p2prl-flood-") as tmp:
        a = make_arena(Path(tmp), model_cache, validators=1, hosts=1)
        try:
            honest = [Identity.generate() for _ in range(miners)]
            log(f"mining {2 * n + miners} honest batches ...")
            warm = [(m, a.mine(m)[1]) for m in honest]
            plain = [(honest[k % miners], a.mine(honest[k % miners])[1]) for k in range(n)]
            flooded = [(honest[k % miners], a.mine(honest[k % miners])[1]) for k in range(n)]
            _start_roles(a)
            log("warm-up: each honest miner's first batch")
            _phase(a, warm, miners * 0.5, 0.5)
            log(f"phase 1: no flood, {seconds:.0f} s")
            base = _phase(a, plain, seconds, every)
            roles = {"validator": a.validator_rt(), "trainer": a.trainer_rt}
            dial = [f"{c.net.addrs[0]}/p2p/{c.net.peer_id}" for c in (a.validator_rt(), a.miner_host)]
            procs = [
                mp.get_context("spawn").Process(
                    target=_attack,
                    args=(tmp, str(model_cache), k, keys, rate, seconds + 6.0, dial),
                    daemon=True,
                )
                for k in range(0 if inject else attackers)
            ]
            latest = [flooded[0][1]]
            stop, counts = threading.Event(), []
            judged_cap = a.validator.jq.judged.capacity
            by: list[tuple[Identity, RolloutAnnouncement]] = []
            flood: tuple[Callable[..., None], tuple[Any, ...]] = (
                _inject,
                (a, rate, keys, latest, stop, counts),
            )
            if many_keys:
                a.validator.jq.judged.capacity = JUDGED_SHRUNK
                by += [*warm, *plain]  # judged already: the replays' targets
                flood = (_inject_many, (a, rate, by, stop, counts))
            threads = [
                threading.Thread(target=flood[0], args=flood[1], daemon=True)
                for _ in range(attackers if inject else 0)
            ]
            for p in procs:
                p.start()
            for th in threads:
                th.start()
            how = "straight to the handlers" if inject else "attacker processes, by gossip"
            who = (
                "a fresh key per message, judged junk and honest replays"
                if many_keys
                else f"{keys} keys each"
            )
            log(f"phase 2: {attackers} flooders ({how}) at {rate:.0f} msg/s each from {who}")
            time.sleep(2.0 if inject else 6.0)  # the attackers start, connect and reach their rate
            seen0 = {n: c.net.stats().get("gossip_in", 0) for n, c in roles.items()}
            under = _phase(a, flooded, seconds, every, sent_log=latest, sent_by=by if many_keys else None)
            delivered = {
                n: (c.net.stats().get("gossip_in", 0) - seen0[n]) / seconds for n, c in roles.items()
            }
            stop.set()
            for th in threads:
                th.join(10)
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
            vlab = a.validator.env.status.snapshot()["labelled"].get("dropped", {})
            vrej = a.validator.env.status.snapshot()["labelled"].get("rejected", {})
            tlab = a.trainer.env.status.snapshot()["labelled"].get("dropped", {})
            checked = a.validator.env.status.counter("batches_checked")
            v = a.validator
            zeroed = sum(1 for m in honest if v.scores.scores(v.current.version).get(m.public_hex, 0) == 0)
            forgotten = v.jq.judged.forgotten
            v.jq.judged.capacity = judged_cap
        finally:
            a.close()
    ratio = under["per_minute"] / base["per_minute"] if base["per_minute"] else 0.0
    return {
        "seconds": seconds,
        "every_s": every,
        "miners": miners,
        "attackers": attackers,
        "keys_per_attacker": keys,
        "inject": inject,
        "many_keys": many_keys,
        "honest_miners_zeroed": zeroed,
        "judged_forgotten": forgotten,
        "injected": sum(counts),
        "flood_msgs_per_s": rate * attackers,  # offered; gossip_in_per_s_under_flood: what arrived
        "no_flood": base,
        "flood": under,
        "ratio": ratio,
        "validator_dropped": vlab,
        "validator_rejected": vrej,  # every key's groups, the flood's junk and squats included
        "trainer_dropped": tlab,
        "gossip_in_per_s_under_flood": delivered,
        "validator_batches_checked": checked,
    }
