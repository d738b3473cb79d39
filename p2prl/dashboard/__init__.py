"""Live terminal view of running nodes, built from their status endpoints."""

from p2prl.dashboard.client import fetch_status
from p2prl.dashboard.live import poll, run_dashboard
from p2prl.dashboard.summary import status_summary
from p2prl.dashboard.view import mean_reward, render, reward_ends, reward_series, sparkline

__all__ = [
    "fetch_status",
    "mean_reward",
    "poll",
    "render",
    "reward_ends",
    "reward_series",
    "run_dashboard",
    "sparkline",
    "status_summary",
]
