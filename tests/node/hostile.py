"""Test helpers over ``p2prl.bench.arena``: drive the judging step and collect verdicts at the trainer."""

from __future__ import annotations

import time
from typing import Any

from p2prl.bench.arena import Arena
from p2prl.crypto.keys import Identity
from p2prl.protocol.messages import Verdict


def judge_all(v: Any, limit: int = 64) -> list[Any]:
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
            for i in arena.trainer.ctx.net.poll(timeout=0.5)
            if i.envelope.type == Verdict.TYPE and i.message.miner in keys
        ]
    assert len(got) >= n, f"{len(got)} of {n} verdicts reached the trainer"
    return got
