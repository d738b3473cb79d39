"""Proof of checkpoint identity: hidden-state fingerprints, the rollout batch blob, the validator's
checks and per-miner scores (docs/PROOF.md). Importing the package does not import torch."""
