"""Live terminal view of running nodes, built from their status endpoints."""

from p2prl.dashboard.client import fetch_status
from p2prl.dashboard.view import render, reward_series, sparkline

__all__ = ["fetch_status", "render", "reward_series", "sparkline"]
