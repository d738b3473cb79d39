"""The reward PNG shows at a glance whether anything was learned: a smoothed reward over the noisy
per-version one, and the last, unfinished versions set apart instead of drawn as a dip."""

import struct
import zlib
from itertools import pairwise

from p2prl.dashboard.plot import (
    LAST_RGB,
    RAW_RGB,
    REWARD_RGB,
    reward_chart,
    smoothed_reward,
    unfinished_tail,
)


def _rows(rewards: list[float]) -> list[dict]:
    return [
        {"version": v, "reward_mean": r, "rollouts_trained": 256, "acceptance": 1.0} for v, r in enumerate(rewards)
    ]


def _pixels(png: bytes) -> dict[tuple[int, int, int], list[tuple[int, int]]]:
    w, h = struct.unpack(">II", png[16:24])
    n = struct.unpack(">I", png[33:37])[0]
    raw = zlib.decompress(png[41 : 41 + n])
    out: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for y in range(h):
        row = raw[y * (1 + 3 * w) + 1 : (y + 1) * (1 + 3 * w)]
        for x in range(w):
            out.setdefault(tuple(row[3 * x : 3 * x + 3]), []).append((x, y))
    return out


def test_the_smoothed_reward_follows_the_trend_not_the_noise() -> None:
    noisy = [0.2 + 0.002 * v + (0.1 if v % 2 else -0.1) for v in range(60)]  # rising, ±0.1 each version
    smooth = [m for _, m in smoothed_reward(_rows(noisy))]
    steps = [b - a for a, b in pairwise(smooth)]
    assert max(abs(s) for s in steps) < 0.05 < 0.2  # the raw series jumps by 0.2 every version
    assert smooth[-1] - smooth[0] > 0.08  # the trend (0.118 over the run) shows
    assert smoothed_reward([{"version": 3, "reward_mean": 0.5}]) == [(3, 0.5)]


def test_a_mean_of_more_rollouts_weighs_more() -> None:
    rows = [
        {"version": 0, "reward_mean": 0.0, "rollouts_trained": 300},
        {"version": 1, "reward_mean": 1.0, "rollouts_trained": 100},
    ]
    assert smoothed_reward(rows, span=3) == [(0, 0.25), (1, 0.25)]


def test_the_last_version_is_a_grey_dot_not_a_dip() -> None:
    rows = _rows([0.3] * 20 + [0.0])  # the run ended on v20 with few rollouts: a mean of 0
    done, tail = unfinished_tail(rows)
    assert [r["version"] for r in tail] == [20] and len(done) == 20
    px = _pixels(reward_chart(rows))
    assert RAW_RGB in px and LAST_RGB in px
    plotted = [(x, y) for x, y in px[REWARD_RGB] if y > 20]  # not the legend's swatch
    right = 720 - 16  # the x of the last version
    assert max(x for x, _ in plotted) < right - 20  # the smoothed line ends at v19
    assert max(y for _, y in plotted) - min(y for _, y in plotted) <= 3  # flat: no dip
    assert any(abs(x - right) <= 2 for x, _ in px[LAST_RGB])
    assert unfinished_tail(rows[:1]) == (rows[:1], [])


def test_versions_the_trainer_took_nothing_of_at_the_end_are_unfinished_too() -> None:
    rows = _rows([0.3] * 5)
    for r in rows[3:]:
        r.update(reward_mean=None, rollouts_trained=0, acceptance=0.0)  # judged or made after the end
    done, tail = unfinished_tail(rows)
    assert [r["version"] for r in done] == [0, 1, 2] and [r["version"] for r in tail] == [3, 4]
    assert unfinished_tail(_rows([0.3] * 5))[1] == [_rows([0.3] * 5)[-1]]
