"""The dishonest miner: a real miner node whose engine generates with perturbed weights.

It mines, commits and announces exactly as an honest miner does, so only the validator's checks
(fingerprints, logprobs) can tell; ``p2prl demo --dishonest-miner`` runs one to show every group it
announces rejected. It lives here, not behind a node setting, so no honest node carries the cheat.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from p2prl.node.miner.miner import Miner
from p2prl.node.runtime.role import RoleEnv
from p2prl.node.runtime.runtime import NodeRuntime
from p2prl.node.setup.settings import MinerSettings
from p2prl.node.weights.version import Weights


def perturb_state(state: dict[str, torch.Tensor], rel: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor plus Gaussian noise of ``rel`` times its std (deterministic in ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        f = v.float()
        std = float(f.std()) if f.numel() > 1 else 0.0
        noise = torch.randn(f.shape, generator=gen) * (rel * (std or 1e-3))
        out[k] = (f + noise).to(v.dtype)
    return out


class DishonestMiner(Miner):
    """A miner that claims version ``v`` but generates with ``v``'s weights plus noise."""

    def __init__(self, env: RoleEnv[MinerSettings], perturb: float) -> None:
        if perturb <= 0:
            raise ValueError("perturb must be positive")
        self.perturb = perturb  # before Miner.__init__, which loads the first weights
        super().__init__(env, share_weights=False)  # its engine runs other weights than the version

    def engine_state(self, w: Weights) -> dict[str, torch.Tensor]:
        return perturb_state(w.state, self.perturb, seed=w.version)


def dishonest_miner(perturb: float) -> Callable[[NodeRuntime], DishonestMiner]:
    """The role factory ``p2prl node`` runs instead of the honest miner's."""
    return lambda rt: DishonestMiner(rt.env(MinerSettings), perturb)
