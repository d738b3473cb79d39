"""Proof of checkpoint identity: hidden-state fingerprints, the rollout batch blob, the validator's
checks and per-miner scores (docs/PROOF.md).

Importing the package does not import torch: its names load on first use (the validator's checks
recompute with torch).
"""

from typing import TYPE_CHECKING

from p2prl.lazyexports import lazy_exports

if TYPE_CHECKING:
    from p2prl.proof.batch import (
        MAGIC,
        BatchLimits,
        build_batch,
        commitment_root,
        decode_batch,
        encode_batch,
        rollout_group,
    )
    from p2prl.proof.calibrate import MIN_TOKENS
    from p2prl.proof.calibrate import calibrate as calibrate_tolerances
    from p2prl.proof.fingerprint import SKETCH_DIM
    from p2prl.proof.miner import mine_batch, sample_keys
    from p2prl.proof.recompute import forward_flat
    from p2prl.proof.scores import ScoreBook
    from p2prl.proof.sides import SideRecord
    from p2prl.proof.validate import (
        BatchVerdict,
        RolloutValidator,
        ValidatorConfig,
        failing_count,
        reject_all,
        to_verdict,
    )

__all__ = [
    "MAGIC",
    "MIN_TOKENS",
    "SKETCH_DIM",
    "BatchLimits",
    "BatchVerdict",
    "RolloutValidator",
    "ScoreBook",
    "SideRecord",
    "ValidatorConfig",
    "build_batch",
    "calibrate_tolerances",
    "commitment_root",
    "decode_batch",
    "encode_batch",
    "failing_count",
    "forward_flat",
    "mine_batch",
    "reject_all",
    "rollout_group",
    "sample_keys",
    "to_verdict",
]

__getattr__ = lazy_exports(__name__)
