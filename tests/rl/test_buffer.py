import threading
from collections import Counter

import pytest

from p2prl.rl.buffer import ReplayBuffer
from p2prl.rl.types import Rollout, RolloutGroup


def group(version: int, tag: int = 0) -> RolloutGroup:
    return RolloutGroup([1, 2], [Rollout([3], [-0.1], 1.0)], version=version, miner=str(tag))


def test_weights_decay_with_half_life() -> None:
    buf = ReplayBuffer(max_staleness=6, half_life=2.0)
    assert buf.weight(0) == 1.0
    assert buf.weight(2) == pytest.approx(0.5)
    assert buf.weight(4) == pytest.approx(0.25)
    assert buf.weight(7) == 0.0 and buf.weight(-1) == 0.0


def test_sampling_prefers_fresh_groups() -> None:
    counts: Counter[int] = Counter()
    for seed in range(400):
        buf = ReplayBuffer(max_staleness=8, half_life=1.0, seed=seed)
        buf.add(group(10))
        buf.add(group(8))
        counts[buf.sample(10, 1)[0].version] += 1
    # P(fresh first) = w0 / (w0 + w2) = 1 / 1.25 = 0.8 for weighted sampling without replacement.
    assert 0.72 < counts[10] / 400 < 0.88


def test_evicts_past_max_staleness_and_skips_future() -> None:
    buf = ReplayBuffer(max_staleness=2, half_life=1.0)
    for v in range(6):
        buf.add(group(v))
    buf.add(group(9))
    assert buf.evict(5) == 3  # versions 0, 1, 2
    assert buf.histogram(5) == {-4: 1, 0: 1, 1: 1, 2: 1}
    got = buf.sample(5, 10)
    assert sorted(g.version for g in got) == [3, 4, 5]
    assert len(buf) == 1  # the future group stays but is never handed out early
    assert not buf.add(group(1))  # already too stale for the last trainer version seen
    assert buf.evicted_stale == 4


def test_capacity_drops_stalest_and_never_blocks() -> None:
    buf = ReplayBuffer(max_staleness=100, half_life=5.0, capacity_groups=3)
    for v in (5, 3, 7):
        assert buf.add(group(v))
    assert buf.add(group(6))  # evicts version 3
    assert not buf.add(group(2))  # stalest itself: dropped
    assert len(buf) == 3 and buf.histogram(7) == {0: 1, 1: 1, 2: 1}
    assert buf.dropped_full == 2
    assert len(buf.sample(7, 10, consume=False)) == 3 and len(buf) == 3
    assert len(buf.sample(7, 2)) == 2 and len(buf) == 1
    assert buf.sample(7, 0) == [] and ReplayBuffer().sample(0, 5) == []


def test_concurrent_add_and_sample_stay_bounded() -> None:
    buf = ReplayBuffer(max_staleness=3, half_life=1.0, capacity_groups=50)
    taken: list[int] = []

    def producer(tag: int) -> None:
        for v in range(200):
            buf.add(group(v // 10, tag))

    def consumer() -> None:
        for v in range(200):
            taken.extend(g.version for g in buf.sample(v // 10, 4))

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(3)] + [
        threading.Thread(target=consumer)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(buf) <= 50 and taken
    assert sum(buf.histogram().values()) == len(buf)


def test_one_miner_cannot_capture_the_buffer() -> None:
    """Item 14: a miner flooding fresher groups neither evicts another miner's groups nor fills
    whole training batches."""
    buf = ReplayBuffer(max_staleness=4, half_life=1.0, capacity_groups=256)
    for _ in range(32):
        assert buf.add(group(4, tag=1))  # an honest miner, one version behind
    for _ in range(1024):
        buf.add(group(5, tag=2))  # the flooder, fresher
    assert len(buf) == 256
    held = Counter(g.miner for g in buf.sample(5, 256, consume=False))
    assert held["1"] == 32
    taken = Counter(g.miner for _ in range(4) for g in buf.sample(5, 8))
    assert taken["1"] == 16 and taken["2"] == 16
