"""vLLM rollout engine for GPUs (optional extra ``p2prl[gpu]``; never imported by the CPU path).

Weights are updated in place through the model's own ``load_weights`` (run inside the engine's
workers via ``collective_rpc``), so applying a patch never reloads or re-compiles the model.
vLLM does not expose last-layer hidden states of sampled tokens, so ``Sample.hidden`` is ``None``
here: the proof layer recomputes them with ``p2prl.rl.engine.teacher_forced`` (one forward pass).
Logprobs are requested as ``processed_logprobs`` — of the distribution actually sampled (after
temperature and top-p) — matching ``HFEngine``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from p2prl.rl.engine import GenerationParams, Sample


def _load_weights_rpc(worker: Any, items: list[tuple[str, Tensor]]) -> int:
    """Runs inside each vLLM worker: feed HF-named tensors to the model's weight loader."""
    model = worker.model_runner.model
    model.load_weights(weights=((k, v.to(worker.device)) for k, v in items))
    return len(items)


class VLLMEngine:
    """``RolloutEngine`` on vLLM. ``model_dir`` is a local HF directory; no downloads."""

    def __init__(
        self, model_dir: str, tokenizer: Any, gpu_memory_utilization: float = 0.5, **llm_kwargs: Any
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "VLLMEngine needs the gpu extra (pip install 'p2prl[gpu]') and a CUDA GPU"
            ) from e
        self.tokenizer = tokenizer
        self.llm = LLM(
            model=str(model_dir),
            dtype="bfloat16",
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=False,
            **llm_kwargs,
        )
        self.model = self.llm

    def generate(
        self, prompts: list[list[int]], n_samples: int, params: GenerationParams
    ) -> list[list[Sample]]:
        from vllm import SamplingParams, TokensPrompt

        sp = SamplingParams(
            n=n_samples,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            logprobs=0,
            stop_token_ids=[self.tokenizer.eos_id],
            detokenize=False,
        )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sp, use_tqdm=False
        )
        result: list[list[Sample]] = []
        for p, out in zip(prompts, outs, strict=True):
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
                group.append(Sample(prompt_ids=list(p), completion_ids=ids, logprobs=lps, hidden=None))
            result.append(group)
        return result

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        items = [(k, v.detach().cpu().contiguous()) for k, v in state.items()]
        self.llm.collective_rpc(_load_weights_rpc, args=(items,))
        self.llm.reset_prefix_cache()
