"""``p2prl bench memory``: peak RSS of each role's model work as a function of parameter count.

Each (size, role) runs in a fresh process that does what the role holds and runs: a miner or validator
loads one bf16 copy (the node's state of the current version is the model's own tensors), switches to
the next version the way a node does (the patch verified, then applied in place: node/weights/live.py) and
generates (the validator also runs the teacher-forced recomputation); the trainer holds fp32 masters
and AdamW state and takes one GRPO step.
Models are random-init Qwen2 directories (``p2prl.rl.randmodel``). Networking is not included: the
node adds its blob store and patch buffers on top (a patch is a few % of the bf16 weights).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROLES = ("miner", "validator", "trainer")
SHAPES = {  # hidden, layers: about 3.5M, 21M and 120M parameters with the 400-token test vocabulary
    "s": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4},
    "m": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 6},
    "l": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 8},
}
GROUP, PROMPTS, NEW_TOKENS = 4, 4, 16
PATCH_DENSITY = 0.1  # the fraction of elements the next version changes (every tensor touched)


def _peak_mib() -> float:
    """This process's peak RSS (``VmHWM``: reset by exec, unlike ``ru_maxrss``, which a child inherits
    from the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_role(model_dir: Path, role: str) -> dict[str, Any]:
    """Run ``role``'s model work on ``model_dir`` in this process; peak RSS before and after it."""
    import torch
    from transformers import Qwen2ForCausalLM  # noqa: F401 - the import's ~150 MiB belong to the baseline

    from p2prl.rl.engine import GenerationParams, HFEngine, teacher_forced
    from p2prl.rl.grpo import GRPOConfig, GRPOTrainer
    from p2prl.rl.model import clone_state, unique_state
    from p2prl.rl.modeldir import load_weights_model
    from p2prl.rl.tokenizer import load_tokenizer
    from p2prl.rl.types import Rollout, RolloutGroup

    torch.set_num_threads(1)
    base = _peak_mib()
    tok = load_tokenizer(model_dir)
    model = load_weights_model(model_dir)
    state = unique_state(model)
    if role == "trainer":
        state = clone_state(state)  # the published bf16 state beside the masters
    else:
        _switch_version(state, model_dir / "next.patch")
    prompts = [tok.encode(f"{i}+{i}=") for i in range(PROMPTS)]
    params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    if role == "trainer":  # rollouts come from miners; a few here, from the bf16 model before it turns fp32
        samples = HFEngine(model, tok, return_hidden=False).generate(prompts, GROUP, params)
        trainer = GRPOTrainer(model, GRPOConfig(), pad_id=tok.pad_id)
        groups = [
            RolloutGroup(
                p, [Rollout(s.completion_ids, s.logprobs, float(j % 2)) for j, s in enumerate(g)], 0, "m"
            )
            for p, g in zip(prompts, samples, strict=True)
        ]
        trainer.step(groups)
    else:
        samples = HFEngine(model, tok).generate(prompts, GROUP, params)
        if role == "validator":
            for g, p in zip(samples, prompts, strict=True):
                teacher_forced(model, p, g[0].completion_ids)
    n = sum(t.numel() for t in state.values())
    return {
        "role": role,
        "parameters": n,
        "bf16_mib": n * 2 / 2**20,
        "baseline_mib": base,
        "peak_mib": _peak_mib(),
    }


def _switch_version(state: dict[str, Any], patch_file: Path) -> None:
    """Verify the next version's patch against ``state`` and apply it in place, as a node does."""
    from p2prl.node.weights.live import LiveWeights
    from p2prl.node.weights.version import Weights
    from p2prl.patch.format import CODEC
    from p2prl.patch.hashing import weights_hash
    from p2prl.protocol.blobs import blob_ref_for
    from p2prl.protocol.messages import PatchManifest

    blob = patch_file.read_bytes()
    meta = json.loads(patch_file.with_suffix(".json").read_text())
    live = LiveWeights(state, Weights(0, weights_hash(state), state))
    m = PatchManifest(1, 0, meta["base"], meta["result"], "delta", CODEC, blob_ref_for(blob), 0)
    live.advance([m], lambda _id: blob)


def write_next_patch(model_dir: Path, density: float = PATCH_DENSITY) -> None:
    """``next.patch`` (and its hashes) in ``model_dir``: about ``density`` of every tensor's elements
    moved by one bf16 step, as a trainer's next version would."""
    import torch

    from p2prl.patch import PatchEncoder
    from p2prl.patch.dtypes import uint_view
    from p2prl.rl.model import unique_state
    from p2prl.rl.modeldir import load_weights_model

    base = unique_state(load_weights_model(model_dir, torch.bfloat16))
    gen = torch.Generator().manual_seed(1)
    new = {}
    for k, t in base.items():
        new[k] = t.clone()
        v = uint_view(new[k])
        v[(torch.rand(v.size, generator=gen) < density).numpy()] ^= 1
    enc = PatchEncoder(base, new)
    (model_dir / "next.patch").write_bytes(b"".join(enc.segments()))
    meta = {"base": enc.base_hash, "result": enc.result_hash}
    (model_dir / "next.json").write_text(json.dumps(meta))


def run_memory_bench(sizes: tuple[str, ...] = tuple(SHAPES)) -> list[dict[str, Any]]:
    """Peak RSS of every role for every size, each in its own process."""
    from p2prl.rl.randmodel import TINY, build_random_model_dir

    rows = []
    with tempfile.TemporaryDirectory(prefix="p2prl-membench-") as tmp:
        for size in sizes:
            shape = {**TINY, "num_attention_heads": 8, "num_key_value_heads": 2, **SHAPES[size]}
            d = build_random_model_dir(Path(tmp) / size, "qwen2", shape=shape)
            write_next_patch(d)
            for role in ROLES:
                out = subprocess.run(
                    [sys.executable, "-m", "p2prl.bench.memory", role, str(d)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows.append({"size": size, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


if __name__ == "__main__":
    print(json.dumps(measure_role(Path(sys.argv[2]), sys.argv[1])))
