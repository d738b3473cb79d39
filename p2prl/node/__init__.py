"""A p2prl node: configuration, the genesis, the three roles and their threads, weight sync, status.

Its names load on first use (the roles import torch), so the command line's light commands stay light.
"""

from typing import TYPE_CHECKING

from p2prl.lazyexports import lazy_exports

if TYPE_CHECKING:
    from p2prl.node.run import run_node
    from p2prl.node.runtime.journal import JOURNAL_DIR, find_by_digest, find_envelopes
    from p2prl.node.runtime.role import NodeStartError
    from p2prl.node.setup.config import ENV_PREFIX, ConfigError, NodeConfig, load_config
    from p2prl.node.setup.genesis import GenesisError, read_genesis, write_genesis
    from p2prl.node.setup.netinit import (
        NetworkSpec,
        describe_model,
        genesis_from_spec,
        init_network,
        spec_warnings,
        with_model_defaults,
    )
    from p2prl.node.validator.validator import position_secret
    from p2prl.node.weights.disk import load_saved_weights
    from p2prl.node.weights.reference import reference_proof

__all__ = [
    "ENV_PREFIX",
    "JOURNAL_DIR",
    "ConfigError",
    "GenesisError",
    "NetworkSpec",
    "NodeConfig",
    "NodeStartError",
    "describe_model",
    "find_by_digest",
    "find_envelopes",
    "genesis_from_spec",
    "init_network",
    "load_config",
    "load_saved_weights",
    "position_secret",
    "read_genesis",
    "reference_proof",
    "run_node",
    "spec_warnings",
    "with_model_defaults",
    "write_genesis",
]

__getattr__ = lazy_exports(__name__)
