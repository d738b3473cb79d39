"""A small network in one process for attack tests and the flood benchmark: real hosts, real roles.

A trainer, genesis validators and any number of plain hosts (miners, attackers) are real
node runtimes (libp2p hosts on 127.0.0.1, all bootstrapped to the trainer); the Trainer and
Validator objects are the real roles, built but not started, so a caller decides which of their
loops run. Honest batches are really mined on a validator's model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2prl.crypto.keys import Identity, load_or_create_identity
from p2prl.net.gossip import Incoming
from p2prl.net.identity import peer_id_for
from p2prl.net.ports import free_port
from p2prl.node.runtime.runtime import NodeRuntime
from p2prl.node.runtime.startup import build_runtime
from p2prl.node.runtime.task import generation_params, task_of
from p2prl.node.setup.config import NodeConfig
from p2prl.node.setup.genesis import write_genesis
from p2prl.node.setup.netinit import NetworkSpec, base_model_info, genesis_from_spec
from p2prl.node.setup.settings import TrainerSettings, ValidatorSettings
from p2prl.protocol.messages import Message, RolloutAnnouncement, Verdict, decode_message, encode_message

if TYPE_CHECKING:
    from p2prl.node.trainer.trainer import Trainer
    from p2prl.node.validator.validator import Validator

NETWORK = "arena-net"


def delivered(identity: Identity, msg: Message, origin: str | None = None) -> Incoming[Any]:
    """``msg`` signed by ``identity`` and verified, as the gossip layer hands it to a role."""
    env, parsed = decode_message(encode_message(identity, NETWORK, msg), NETWORK)
    peer = origin or peer_id_for(identity)
    return Incoming(f"arena/{env.type}", env, parsed, peer, peer)


@dataclass
class Arena:
    root: Path
    ids: dict[str, Identity]
    trainer: Trainer
    validators: list[Validator]
    hosts: list[NodeRuntime]  # plain hosts: hosts[0] serves the honest miners' blobs
    runtimes: list[NodeRuntime] = field(default_factory=list)  # the trainer's first, then validators'

    @property
    def trainer_rt(self) -> NodeRuntime:
        return self.runtimes[0]

    def validator_rt(self, i: int = 0) -> NodeRuntime:
        return self.runtimes[1 + i]
    _next_index: dict[str, int] = field(default_factory=dict)

    @property
    def validator(self) -> Validator:
        return self.validators[0]

    @property
    def miner_host(self) -> NodeRuntime:
        return self.hosts[0]

    def mine(self, miner: Identity, serve: bool = True) -> tuple[bytes, RolloutAnnouncement]:
        """A genuine batch of ``miner`` at version 0 (served by the miner host unless ``serve`` is False)."""
        from p2prl.proof.miner import mine_batch

        v = self.validator
        env = v.env
        first = self._next_index.get(miner.public_hex, 0)
        n = env.g.generation.groups_per_batch
        self._next_index[miner.public_hex] = first + n
        prep = mine_batch(
            v.engine,
            task_of(env),
            0,
            v.current.hash,
            miner.public_key,
            list(range(first, first + n)),
            env.g.generation.group_size,
            generation_params(env, seed=first),
        )
        if serve:
            self.serve(prep.blob, prep.announcement)
        return prep.blob, prep.announcement

    def serve(self, data: bytes, ann: RolloutAnnouncement) -> None:
        self.miner_host.store.put(data, expected_id=ann.blob.id)
        self.miner_host.store.pin([ann.blob.id])
        self.miner_host.net.serve(ann.blob)

    def announce(self, identity: Identity, ann: RolloutAnnouncement) -> Incoming[RolloutAnnouncement]:
        """``ann`` signed by ``identity``, as published from the miner host (which serves the blobs)."""
        return delivered(identity, ann, origin=self.miner_host.net.peer_id)

    def close(self) -> None:
        for rt in self.runtimes:
            rt.stop.set()
        for rt in self.runtimes:
            rt.join(10)
            rt.net.stop()


def judge_all(v: Validator, limit: int = 64) -> list[Any]:
    """Run a validator's judging step until its queue is empty; the BatchVerdicts made."""
    out = []
    for _ in range(limit):
        item = v._next()
        if item is None:
            break
        out.append(v.check(item))
    return out


def verdicts_at_trainer(arena: Arena, n: int, *miners: Identity, timeout: float = 20.0) -> list[Any]:
    """The next ``n`` verdicts on ``miners``' batches the trainer's host receives (others dropped)."""
    keys = {m.public_hex for m in miners}
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += [
            i
            for i in arena.trainer_rt.net.poll(timeout=0.5)
            if i.envelope.type == Verdict.TYPE and i.message.miner in keys
        ]
    if len(got) < n:
        raise TimeoutError(f"{len(got)} of {n} verdicts reached the trainer")
    return got


def make_arena(tmp: Path, model_cache: Path, validators: int = 2, hosts: int = 1, groups: int = 2) -> Arena:
    """Build (not start) a trainer, ``validators`` validators and ``hosts`` plain hosts, connected."""
    from p2prl.node.trainer.trainer import Trainer
    from p2prl.node.validator.validator import Validator

    vnames = [f"validator{i}" for i in range(validators)]
    hnames = [f"miner{i}" for i in range(hosts)]
    names = ["trainer", *vnames, *hnames]
    ids = {n: load_or_create_identity(tmp / n / "node.key") for n in names}
    port = free_port()
    spec = NetworkSpec(
        network_id=NETWORK,
        validators=[ids[n].public_hex for n in vnames],
        bootstrap=[f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_for(ids['trainer'])}"],
        max_new_tokens=4,
        group_size=4,
        groups_per_batch=groups,
        anchor_interval=3,
        chunk_size=64 * 1024,
    )
    genesis = write_genesis(
        genesis_from_spec(spec, ids["trainer"], base_model_info(model_cache)), tmp / "genesis.json"
    )

    def cfg(name: str) -> NodeConfig:
        role = "miner" if name.startswith("miner") else name.rstrip("0123456789")
        return NodeConfig(
            role=role,  # type: ignore[arg-type]
            network=genesis,
            data_dir=tmp / name,
            listen=f"/ip4/127.0.0.1/tcp/{port if role == 'trainer' else 0}",
            model_cache=model_cache,
            s3_enable=False,
            status_port=-1,
        )

    runtimes: list[NodeRuntime] = []
    try:
        for n in names:
            runtimes.append(build_runtime(cfg(n)))
        t_rt, v_rts, h_rts = runtimes[0], runtimes[1 : 1 + validators], runtimes[1 + validators :]
        trainer = Trainer(t_rt.env(TrainerSettings))
        roles = [Validator(rt.env(ValidatorSettings)) for rt in v_rts]
        for v in roles:
            v.wait_calibrated()  # attacks are judged with the tolerances a settled validator has
        for v in v_rts:
            for h in h_rts:
                v.net.connect(f"{h.net.addrs[0]}/p2p/{h.net.peer_id}")
        _wait_connected(t_rt, {rt.net.peer_id for rt in runtimes[1:]})
        time.sleep(1.5)  # gossip meshes form on the heartbeat after connecting
    except BaseException:
        for rt in runtimes:
            rt.net.stop()
        raise
    return Arena(tmp, ids, trainer, roles, h_rts, runtimes)


def _wait_connected(rt: NodeRuntime, peers: set[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if peers <= {p.peer_id for p in rt.net.peers() if p.connected}:
            return
        time.sleep(0.2)
    raise RuntimeError("the arena's hosts did not connect")
