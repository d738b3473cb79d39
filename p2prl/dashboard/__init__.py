"""Live terminal view of running nodes, built from their status endpoints."""

from p2prl.dashboard.client import fetch_status
from p2prl.dashboard.live import poll, run_dashboard
from p2prl.dashboard.plot import reward_chart, write_chart
from p2prl.dashboard.summary import (
    SUMMARY_CHECKS,
    per_version,
    run_checks,
    run_report,
    status_summary,
    verdict_line,
    write_csv,
)
from p2prl.dashboard.view import mean_reward, render, reward_ends, reward_series, sparkline

__all__ = [
    "SUMMARY_CHECKS",
    "fetch_status",
    "mean_reward",
    "per_version",
    "poll",
    "render",
    "reward_chart",
    "reward_ends",
    "reward_series",
    "run_checks",
    "run_dashboard",
    "run_report",
    "sparkline",
    "status_summary",
    "verdict_line",
    "write_chart",
    "write_csv",
]
