import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu

_REASON = None
if importlib.util.find_spec("vllm") is None:
    _REASON = "vllm is not installed (optional gpu extra)"
elif not torch.cuda.is_available():
    _REASON = "no CUDA device"


@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_vllm_matches_teacher_forced_and_updates_in_place(default_model_dir) -> None:
    from p2prl.rl.engine import GenerationParams, teacher_forced
    from p2prl.rl.model import load_model, unique_state
    from p2prl.rl.vllm_engine import VLLMEngine

    model, tok = load_model(default_model_dir, torch.float32)
    eng = VLLMEngine(str(default_model_dir), tok, gpu_memory_utilization=0.2)
    out = eng.generate([tok.encode("12+34=")], 4, GenerationParams(4, seed=1))
    for s in out[0]:
        lp, _ = teacher_forced(model, s.prompt_ids, s.completion_ids)
        assert torch.allclose(lp, torch.tensor(s.logprobs), atol=0.1)
    eng.load_state_dict({k: torch.zeros_like(v) for k, v in unique_state(model).items()})
    zero = eng.generate([tok.encode("1+1=")], 2, GenerationParams(2, seed=1))
    assert all(len(s.completion_ids) >= 1 for s in zero[0])


def test_vllm_module_imports_without_vllm() -> None:
    import p2prl.rl.vllm_engine as m

    assert hasattr(m, "VLLMEngine")
