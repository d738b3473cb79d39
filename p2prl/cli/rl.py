"""``p2prl train-local`` (placeholder until the RL core lands)."""

import typer


def train_local() -> None:
    """Run generation, reward, replay buffer and GRPO in one process."""
    raise typer.Exit(2)
