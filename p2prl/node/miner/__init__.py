"""The miner role: generate rollout groups on the version it runs, commit, announce."""
