"""Live terminal view of running nodes, built from their status endpoints."""

from p2prl.dashboard.view import render, reward_series, sparkline

__all__ = ["render", "reward_series", "sparkline"]
