"""p2prl: peer-to-peer RL post-training of language models."""

from p2prl.importguard import install as _install_import_guard

__version__ = "0.1.0"

_install_import_guard()  # broken optional media builds (vLLM's CPU extra) stay out of transformers
