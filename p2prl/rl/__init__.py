"""The learning half of p2prl: tasks, rollout engines, GRPO and the replay buffer.

The tasks are torch-free and imported at once; every other name loads its module (torch,
transformers) on first use, so importing the package costs no torch.
"""

from typing import TYPE_CHECKING

from p2prl.lazyexports import lazy_exports
from p2prl.rl.tasks import Task, derive_seed, file_sha256, get_task, parse_task_params, pin_task_params

if TYPE_CHECKING:
    from p2prl.rl.buffer import ReplayBuffer
    from p2prl.rl.cpu import torch_threads
    from p2prl.rl.distributed import launched, make_learner, rank
    from p2prl.rl.engine import (
        GenerationParams,
        HFEngine,
        RolloutEngine,
        Sample,
        copy_state_in_place,
        processed_logprobs,
        teacher_forced,
    )
    from p2prl.rl.engines import (
        ENGINES,
        EngineChoice,
        EngineChoiceError,
        choose_engine,
        open_vllm,
        vllm_unsupported,
    )
    from p2prl.rl.evaluate import evaluate as evaluate_policy
    from p2prl.rl.evaluate import evaluate_dir
    from p2prl.rl.gendefaults import MODEL_LR, RunDefaults, run_defaults
    from p2prl.rl.ggufdir import PRESETS as GGUF_PRESETS
    from p2prl.rl.ggufdir import convert as convert_gguf
    from p2prl.rl.ggufdir import from_package as model_from_package
    from p2prl.rl.grpo import GRPOConfig, PolicyLearner
    from p2prl.rl.local import DEFAULT_LR, LocalConfig, default_cache_dir, train_local
    from p2prl.rl.model import (
        ARCH,
        BIG_ARCH,
        build_default_model,
        clone_state,
        load_model,
        model_meta,
        pick_device,
        random_qwen2,
        unique_state,
        weights_hash,
    )
    from p2prl.rl.modeldir import (
        ModelDirError,
        check_files,
        config_sha256,
        describe,
        has_weights,
        load_weights_model,
        model_from_config,
        pack_files,
        stop_ids_of,
        tokenizer_sha256,
        unpack_files,
    )
    from p2prl.rl.randmodel import QWEN25_05B, TINY, VLLM_TINY, build_random_model_dir
    from p2prl.rl.sampling import (
        apply_top_p,
        greedy_intervals,
        interval_distance,
        intervals_of,
        pick_tokens,
        sample_key,
        token_intervals,
        uniforms,
    )
    from p2prl.rl.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
    from p2prl.rl.types import Rollout, RolloutGroup
    from p2prl.rl.verify import binom_log_sf

__all__ = [
    "ARCH",
    "BIG_ARCH",
    "DEFAULT_LR",
    "ENGINES",
    "GGUF_PRESETS",
    "MODEL_LR",
    "QWEN25_05B",
    "TINY",
    "VLLM_TINY",
    "CharTokenizer",
    "EngineChoice",
    "EngineChoiceError",
    "GRPOConfig",
    "GenerationParams",
    "HFEngine",
    "LocalConfig",
    "ModelDirError",
    "PolicyLearner",
    "ReplayBuffer",
    "Rollout",
    "RolloutEngine",
    "RolloutGroup",
    "RunDefaults",
    "Sample",
    "Task",
    "Tokenizer",
    "apply_top_p",
    "binom_log_sf",
    "build_default_model",
    "build_random_model_dir",
    "check_files",
    "choose_engine",
    "clone_state",
    "config_sha256",
    "convert_gguf",
    "copy_state_in_place",
    "default_cache_dir",
    "derive_seed",
    "describe",
    "evaluate_dir",
    "evaluate_policy",
    "file_sha256",
    "get_task",
    "greedy_intervals",
    "has_weights",
    "interval_distance",
    "intervals_of",
    "launched",
    "load_model",
    "load_tokenizer",
    "load_weights_model",
    "make_learner",
    "model_from_config",
    "model_from_package",
    "model_meta",
    "open_vllm",
    "pack_files",
    "parse_task_params",
    "pick_device",
    "pick_tokens",
    "pin_task_params",
    "processed_logprobs",
    "random_qwen2",
    "rank",
    "run_defaults",
    "sample_key",
    "stop_ids_of",
    "teacher_forced",
    "token_intervals",
    "tokenizer_sha256",
    "torch_threads",
    "train_local",
    "uniforms",
    "unique_state",
    "unpack_files",
    "vllm_unsupported",
    "weights_hash",
]

__getattr__ = lazy_exports(__name__)
