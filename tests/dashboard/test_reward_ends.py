"""The demo summary's reward ends: means over the first / last 10 % of versions, weighted by count."""

from __future__ import annotations

import pytest

from p2prl.dashboard.view import reward_ends


def test_reward_ends_use_at_least_three_versions() -> None:
    series = [(v, r, 10) for v, r in enumerate([0.0, 0.3, 0.6, 0.9, 0.1, 0.2, 0.4])]
    first, last = reward_ends(series)
    assert first == pytest.approx(0.3)
    assert last == pytest.approx((0.1 + 0.2 + 0.4) / 3)


def test_reward_ends_weight_by_count_over_ten_percent() -> None:
    # 50 versions: 5 at each end; one noisy version does not decide the figure
    series = [(v, 0.2, 100) for v in range(25)] + [(v, 0.5, 100) for v in range(25, 50)]
    series[0] = (0, 1.0, 100)
    series[-1] = (49, 0.0, 300)
    first, last = reward_ends(series)
    assert first == pytest.approx((1.0 + 4 * 0.2) / 5)
    assert last == pytest.approx(4 * 0.5 * 100 / 700)


def test_reward_ends_empty() -> None:
    assert reward_ends([]) == (None, None)
