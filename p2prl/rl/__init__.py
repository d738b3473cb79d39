"""The learning half of p2prl: tasks, rollout engines, GRPO and the replay buffer.

Submodules import torch/transformers; import them directly (``p2prl.rl.tasks`` is torch-free).
"""
