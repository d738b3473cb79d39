"""``p2prl bench proof``: acceptance of honest and dishonest miners, on two model configurations.

Every case runs real generation with ``HFEngine`` (KV cache) and real validation (one batched full
forward); the dishonest miners are built from the same parts with one thing changed.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from p2prl.patch import changed_fraction
from p2prl.proof.batch import build_batch
from p2prl.proof.calibrate import calibrate
from p2prl.proof.fingerprint import SKETCH_DIM
from p2prl.proof.miner import PreparedBatch, announce, mine_batch
from p2prl.proof.validate import RolloutValidator, ValidatorConfig
from p2prl.protocol import DEFAULT_MAX_STALENESS, GenerationSpec

CASES = (
    "honest_b1",
    "honest_b8",
    "honest_b32",
    "honest_threads",
    "other_weights",
    "perturbed_weights",
    "other_model_tokens",
    "tampered_reward",
    "copied",
    "stale_k1",
    "stale_k2",
    "stale_k4",
    "stale_k8",
    "stale_k16",
)
STALE_KS = (1, 2, 4, 8, 16)
TOLERANCES = (
    "fingerprint_tol",
    "fingerprint_tol_rollout",
    "logprob_tol_mean",
    "logprob_tol_max",
    "sampling_margin",
    "sampling_miss_rate",
)
GROUP_SIZE = 8
MINER_A = bytes(range(32))
MINER_B = bytes(range(32, 64))

@dataclass
class ModelSetup:
    name: str
    model: Any
    tokenizer: Any
    task: Any
    params: Any  # GenerationParams
    other: Any  # same architecture, other weights


def setups(cache_dir: Path, which: tuple[str, ...]) -> list[ModelSetup]:
    from p2prl.rl.engine import GenerationParams
    from p2prl.rl.model import ARCH, BIG_ARCH, build_default_model, load_model, random_qwen2
    from p2prl.rl.tasks import get_task

    out = []
    if "tiny" in which:
        model, tok = load_model(build_default_model(cache_dir))
        out.append(
            ModelSetup(
                "tiny",
                model,
                tok,
                get_task("addition", digits=2),
                GenerationParams(max_new_tokens=4, temperature=1.0),
                random_qwen2(ARCH, tok.vocab_size, 7),
            )
        )
    if "big" in which:
        from p2prl.rl.tokenizer import CharTokenizer

        tok = CharTokenizer()
        out.append(
            ModelSetup(
                "big",
                random_qwen2(BIG_ARCH, tok.vocab_size, 0),
                tok,
                get_task("addition", digits=2),
                GenerationParams(max_new_tokens=24, temperature=1.0),
                random_qwen2(BIG_ARCH, tok.vocab_size, 1),
            )
        )
    if "real" in which:
        out.append(real_setup(cache_dir))
    return out


def real_setup(cache_dir: Path, max_new_tokens: int = 24) -> ModelSetup:
    """SmolLM2-135M-Instruct (the package index's GGUF, converted to bf16 in ``cache_dir``), chat
    prompts of 2-digit additions, as ``p2prl demo --preset smollm2`` runs it; its "other weights"
    are the int8 round trip of every matrix (another model of that size is not at hand)."""
    from p2prl.rl import GGUF_PRESETS, load_tokenizer, load_weights_model, model_from_package
    from p2prl.rl.engine import GenerationParams
    from p2prl.rl.tasks import get_task

    pkg = GGUF_PRESETS["smollm2"]
    d = Path(cache_dir) / "models" / pkg.directory
    if not (d / "config.json").exists():
        model_from_package(pkg, d)
    model = load_weights_model(d)
    tok = load_tokenizer(d, "chat")
    return ModelSetup(
        "real",
        model,
        tok,
        get_task("addition", digits=2, style="chat"),
        GenerationParams(max_new_tokens=max_new_tokens, temperature=1.0),
        int8_round_trip(model),
    )


def generation_spec(params: Any, groups_per_batch: int = 8) -> GenerationSpec:
    """The genesis generation section of a network whose miners sample with ``params``
    (``GenerationParams``) in groups of ``GROUP_SIZE``: what the benchmark's validators hold them to."""
    return GenerationSpec(
        max_new_tokens=params.max_new_tokens,
        temperature_milli=round(params.temperature * 1000),
        top_p_milli=round(params.top_p * 1000),
        group_size=GROUP_SIZE,
        groups_per_batch=groups_per_batch,
    )


def manifest_of(model: Any) -> str:
    from p2prl.rl.model import unique_state, weights_hash

    return weights_hash(unique_state(model))


def int8_round_trip(model: Any) -> Any:
    """Per-row absmax int8 quantization of every matrix, and back to bf16."""
    import torch

    q = copy.deepcopy(model)
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() == 2:
                s = p.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
                p.copy_((torch.round(p.float() / s).clamp(-127, 127) * s).to(p.dtype))
    return q


def fp16_changed_fraction(model: Any) -> float:
    """Fraction of bf16 weights an fp16 round trip changes (bf16 values inside fp16's range survive)."""
    import torch

    params = {k: p.detach() for k, p in model.named_parameters()}
    return changed_fraction(params, {k: p.to(torch.float16).to(p.dtype) for k, p in params.items()})


def train_versions(setup: ModelSetup, n: int, lr: float, seed: int = 0) -> list[Any]:
    """``n + 1`` bf16 versions from GRPO-shaped AdamW steps on fp32 master weights.

    Each step samples 4 prompts x 8 completions from the current bf16 policy and ascends
    ``sum(advantage * logprob)`` with group-normalized advantages (the task reward plus a little
    noise, so the random-init model, which never scores, still gets GRPO-sized gradients).
    """
    import torch

    from p2prl.rl.engine import HFEngine
    from p2prl.rl.tasks import derive_seed

    gen = torch.Generator().manual_seed(seed)
    master = copy.deepcopy(setup.model).float().train()
    opt = torch.optim.AdamW(master.parameters(), lr=lr, weight_decay=0.0)
    versions = [copy.deepcopy(setup.model)]
    tok = setup.tokenizer
    for step in range(n):
        policy = versions[-1]
        engine = HFEngine(policy, tok, return_hidden=False)
        probs = [setup.task.problem(derive_seed("00" * 32, b"trainer", step * 4 + i)) for i in range(4)]
        prompts = [tok.encode(p.prompt) for p in probs]
        groups = engine.generate(prompts, GROUP_SIZE, replace(setup.params, seed=step))
        seqs, advs, starts = [], [], []
        for prob, prompt, group in zip(probs, prompts, groups, strict=True):
            r = torch.tensor([setup.task.reward(prob, tok.decode(s.completion_ids)) for s in group])
            r = r + 0.1 * torch.randn(len(group), generator=gen)
            advs += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
            seqs += [prompt + s.completion_ids for s in group]
            starts += [len(prompt)] * len(group)
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        weight = torch.zeros((len(seqs), width))
        for i, (s, st, a) in enumerate(zip(seqs, starts, advs, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            weight[i, st : len(s)] = a / len(seqs)
        mask = (torch.arange(width) < torch.tensor([len(s) for s in seqs])[:, None]).long()
        logits = master(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None]).squeeze(2)
        loss = -(lp * weight[:, 1:]).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        nxt = copy.deepcopy(policy)
        with torch.no_grad():
            for (_, pb), (_, pm) in zip(nxt.named_parameters(), master.named_parameters(), strict=True):
                pb.copy_(pm.to(pb.dtype))
        versions.append(nxt.eval())
    return versions


def _groups_for(n_rollouts: int) -> list[int]:
    return list(range(max(1, -(-n_rollouts // GROUP_SIZE))))


def _count(verdict: Any, prepared: PreparedBatch) -> tuple[int, int]:
    n = prepared.batch.n_rollouts
    return n, verdict.accepted_rollouts


def _forge_other_tokens(setup: ModelSetup, version: int, mh: str, indices: list[int]) -> PreparedBatch:
    """Tokens sampled from another model, then proved (hidden states, logprobs) with the right one."""
    from p2prl.rl.engine import HFEngine, Sample, teacher_forced

    other = mine_batch(
        HFEngine(setup.other, setup.tokenizer),
        setup.task,
        version,
        mh,
        MINER_A,
        indices,
        GROUP_SIZE,
        setup.params,
    )
    groups = []
    p = setup.params
    for g in other.batch.groups:
        prompt = g.prompt_ids.tolist()
        samples = []
        for r in g.rollouts:
            ids = r.completion_ids.tolist()
            lp, h = teacher_forced(setup.model, prompt, ids, p.temperature, p.top_p)
            samples.append(Sample(prompt, ids, lp.tolist(), h))
        groups.append((g.index, prompt, samples, [r.reward for r in g.rollouts]))
    return announce(build_batch(version, mh, MINER_A, groups))


def run_setup(
    setup: ModelSetup, n_rollouts: int, lr: float, log: Any = print, checked_per_group: int = 2
) -> dict[str, Any]:
    """All cases for one model; returns ``{case: (n, accepted)}`` plus timings and details.

    Cases are judged by a validator that recomputes ``checked_per_group`` rollouts per group (as
    nodes do); the honest batch is also judged with every rollout recomputed, for the full cost."""
    import torch

    from p2prl.rl.engine import HFEngine

    threads = torch.get_num_threads()
    res: dict[str, Any] = {"cases": {}, "details": {}}
    p = setup.params
    cfg = ValidatorConfig(
        generation=generation_spec(p),
        max_staleness=DEFAULT_MAX_STALENESS,
        fixed_group_count=False,  # the cases' batches hold as many groups as n_rollouts needs
        checked_per_group=checked_per_group,
        checked_tokens=0,  # exactly checked_per_group per group: what the benchmark measures
    )
    mh = manifest_of(setup.model)
    idx = _groups_for(n_rollouts)
    cfg, drift = calibrate(setup.model, setup.tokenizer, setup.task, p, mh, cfg)
    res["calibration"] = {"honest_drift": drift, **{k: getattr(cfg, k) for k in TOLERANCES}}
    log(f"  {setup.name:5s} calibrated: {res['calibration']}")

    def validator() -> RolloutValidator:
        return RolloutValidator.for_model(setup.model, setup.tokenizer, setup.task, 5, mh, config=cfg)

    def judge(
        case: str, prepared: PreparedBatch, v: RolloutValidator | None = None, key: bytes = MINER_A
    ) -> Any:
        v = v or validator()
        t0 = time.perf_counter()
        verdict = v.check(prepared.announcement, key, prepared.blob, 5)
        dt = time.perf_counter() - t0
        n, acc = _count(verdict, prepared)
        res["cases"][case] = (n, acc)
        res["details"][case] = {"reasons": verdict.reasons(), "verify_s": dt, **verdict.stats.to_dict()}
        log(f"  {setup.name:5s} {case:20s} {acc:4d}/{n:<4d} {verdict.reasons()}")
        return verdict

    # honest, at three engine batch sizes (the validator always runs one padded full forward)
    for case, bs in (("honest_b1", 1), ("honest_b8", 8), ("honest_b32", 32)):
        eng = HFEngine(setup.model, setup.tokenizer, max_batch=bs)
        t0 = time.perf_counter()
        prepared = mine_batch(eng, setup.task, 5, mh, MINER_A, idx, GROUP_SIZE, replace(p, seed=bs))
        gen_s = time.perf_counter() - t0
        judge(case, prepared)
        res["details"][case]["generate_s"] = gen_s
        full = RolloutValidator.for_model(
            setup.model, setup.tokenizer, setup.task, 5, mh, config=replace(cfg, checked_per_group=0)
        )
        t0 = time.perf_counter()
        full.check(prepared.announcement, MINER_A, prepared.blob, 5)
        res["details"][case]["verify_full_s"] = time.perf_counter() - t0
    torch.set_num_threads(1)  # the miner on one thread, the validator on all
    try:
        prepared = mine_batch(
            HFEngine(setup.model, setup.tokenizer, max_batch=8),
            setup.task,
            5,
            mh,
            MINER_A,
            idx,
            GROUP_SIZE,
            replace(p, seed=11),
        )
    finally:
        torch.set_num_threads(threads)
    judge("honest_threads", prepared)

    prepared = mine_batch(
        HFEngine(setup.other, setup.tokenizer), setup.task, 5, mh, MINER_A, idx, GROUP_SIZE, p
    )
    judge("other_weights", prepared)
    prepared = mine_batch(
        HFEngine(int8_round_trip(setup.model), setup.tokenizer),
        setup.task,
        5,
        mh,
        MINER_A,
        idx,
        GROUP_SIZE,
        p,
    )
    judge("perturbed_weights", prepared)
    res["details"]["fp16_round_trip_changed_fraction"] = fp16_changed_fraction(setup.model)
    judge("other_model_tokens", _forge_other_tokens(setup, 5, mh, idx))

    honest = mine_batch(
        HFEngine(setup.model, setup.tokenizer, max_batch=32),
        setup.task,
        5,
        mh,
        MINER_A,
        idx,
        GROUP_SIZE,
        replace(p, seed=99),
    )
    tampered = copy.deepcopy(honest.batch)
    for g in tampered.groups:
        g.rollouts[0].reward = 1.0 - g.rollouts[0].reward
    judge("tampered_reward", announce(tampered))

    v = validator()
    v.check(honest.announcement, MINER_A, honest.blob, 5)  # the original is seen first
    stolen = copy.deepcopy(honest.batch)
    stolen.miner = MINER_B
    judge("copied", announce(stolen), v, key=MINER_B)

    # stale: generate with version current - k, claim the current version
    t0 = time.perf_counter()
    versions = train_versions(setup, max(STALE_KS), lr)
    res["details"]["train_versions_s"] = time.perf_counter() - t0
    cur = versions[-1]
    cur_mh = manifest_of(cur)
    res["details"]["changed_fraction_per_version"] = changed_fraction(
        dict(versions[-2].named_parameters()), dict(cur.named_parameters())
    )
    for k in STALE_KS:
        old = versions[-1 - k]
        prepared = mine_batch(
            HFEngine(old, setup.tokenizer, max_batch=32),
            setup.task,
            5,
            cur_mh,
            MINER_A,
            idx,
            GROUP_SIZE,
            replace(p, seed=100 + k),
        )
        # a fresh validator per k: each case's batch reuses the same prompt slots
        fresh = RolloutValidator.for_model(cur, setup.tokenizer, setup.task, 5, cur_mh, config=cfg)
        judge(f"stale_k{k}", prepared, fresh)
    n = res["cases"]["honest_b32"][0]
    res["verify_seconds_per_rollout"] = res["details"]["honest_b32"]["verify_s"] / n
    res["generate_seconds_per_rollout"] = res["details"]["honest_b32"]["generate_s"] / n
    res["verify_full_seconds_per_rollout"] = res["details"]["honest_b32"]["verify_full_s"] / n
    tokens = honest.batch.n_completion_tokens
    res["blob_bytes_per_token"] = len(honest.blob) / tokens
    res["grail_reference"] = grail_reference(setup, n_rollouts, mh)
    log(f"  {setup.name:5s} grail's sketch, accepted: {res['grail_reference']}")
    res["mean_completion_tokens"] = tokens / honest.batch.n_rollouts
    return res


def grail_reference(setup: ModelSetup, n_rollouts: int, mh: str) -> dict[str, dict[str, int]]:
    """grail's sketch (``grail_ref``) on the same kind of hidden states as our cases: an honest miner
    (KV cache) against the validator's full forward, a miner with other weights, and one with the
    int8 round trip; a rollout is accepted when every challenged position passes."""
    from p2prl.bench import grail_ref
    from p2prl.proof.recompute import forward_flat
    from p2prl.rl.engine import HFEngine
    from p2prl.rl.tasks import derive_seed

    coeffs = grail_ref.coefficients(bytes.fromhex(mh))
    rng = np.random.default_rng(0)
    probs = [setup.task.problem(derive_seed(mh, MINER_A, i)) for i in _groups_for(n_rollouts)]
    prompts = [setup.tokenizer.encode(p.prompt) for p in probs]
    out = {}
    for case, model in (
        ("honest", setup.model),
        ("other_weights", setup.other),
        ("perturbed_weights", int8_round_trip(setup.model)),
    ):
        groups = HFEngine(model, setup.tokenizer, max_batch=32).generate(
            prompts, GROUP_SIZE, replace(setup.params, seed=7)
        )
        samples = [s for g in groups for s in g]
        seqs = [(np.array(s.prompt_ids), np.array(s.completion_ids)) for s in samples]
        hidden, _ = forward_flat(setup.model, seqs)  # the validator always runs the right model
        ends = np.cumsum([len(s.completion_ids) for s in samples])
        accepted = sum(
            grail_ref.rollout_passes(s.hidden, hv, coeffs, rng, start=len(s.prompt_ids))
            for s, hv in zip(samples, np.split(hidden.numpy(), ends[:-1]), strict=True)
        )
        out[case] = {"n": len(samples), "accepted": int(accepted)}
    return out


def run(
    cache_dir: Path,
    n_rollouts: int,
    models: tuple[str, ...],
    lr: float,
    log: Any = print,
    checked_per_group: int = 2,
) -> dict[str, Any]:
    """The whole benchmark; the JSON object ``p2prl bench proof --json`` prints."""
    per_model = {}
    for s in setups(cache_dir, models):
        log(f"model {s.name}: {sum(p.numel() for p in s.model.parameters()) / 1e6:.1f}M parameters")
        per_model[s.name] = run_setup(s, n_rollouts, lr, log, checked_per_group)
    cases = []
    for c in CASES:
        n = sum(r["cases"][c][0] for r in per_model.values())
        acc = sum(r["cases"][c][1] for r in per_model.values())
        cases.append({"case": c, "n": n, "accepted": acc})
    ver = [r["verify_seconds_per_rollout"] for r in per_model.values()]
    gen = [r["generate_seconds_per_rollout"] for r in per_model.values()]
    full = [r["verify_full_seconds_per_rollout"] for r in per_model.values()]
    return {
        "cases": cases,
        "verify_seconds_per_rollout": float(np.mean(ver)),
        "generate_seconds_per_rollout": float(np.mean(gen)),
        "verify_full_seconds_per_rollout": float(np.mean(full)),
        "commitment_bytes_per_token": SKETCH_DIM,
        "grail_reference": {
            c: {k: sum(r["grail_reference"][c][k] for r in per_model.values()) for k in ("n", "accepted")}
            for c in ("honest", "other_weights", "perturbed_weights")
        },
        "models": {
            name: {
                "cases": [{"case": c, "n": r["cases"][c][0], "accepted": r["cases"][c][1]} for c in CASES],
                **{k: v for k, v in r.items() if k != "cases"},
            }
            for name, r in per_model.items()
        },
        "settings": {
            "rollouts_per_case": n_rollouts,
            "group_size": GROUP_SIZE,
            "checked_per_group": checked_per_group,
            "lr": lr,
        },
    }


def honest_acceptance(
    cache_dir: Path,
    n_rollouts: int,
    models: tuple[str, ...],
    batch_sizes: tuple[int, ...] = (1, 8, 32),
    threads: tuple[int, ...] = (1, 2),
    log: Any = print,
    miner_device: str = "cpu",
    validator_device: str = "cpu",
    train_steps: int = 0,
    lr: float = 3e-3,
    max_new_tokens: int = 0,
    engine: str = "hf",
    miner_isa: str = "",
) -> dict[str, Any]:
    """``p2prl bench honest``: honest miners at every (engine batch size, thread count), each batch
    judged with every rollout recomputed by a validator with calibrated tolerances, as a node runs
    it. Returns per model and setting the rollouts, the accepted ones, the rejection reasons and the
    largest honest errors next to the tolerances they must stay under (the margin behind zero false
    rejects).

    The validator calibrates on its own device, as a node does; a miner on another device (a CUDA
    miner judged on a CPU validator) shows what crossing devices costs. ``train_steps`` first trains
    the model that many GRPO-shaped steps (a trained policy's logits are larger and peakier than a
    random init's, which is where bf16 rounding shows); ``max_new_tokens`` overrides the completion
    length. ``engine="vllm"``: the miner is a vLLM miner (``node.weights.engine.VLLMMinerEngine``: vLLM picks
    the tokens, one teacher-forced transformers pass gives the states and logprobs) on the model
    written to a directory; vLLM batches by itself, so batch sizes and threads do not apply (one row,
    batch 0, threads 0); a model vLLM cannot run is skipped with the reason. ``miner_isa="avx2"``:
    the miner runs an AVX2 CPU's kernels (``node.weights.isa``, its own process: threads 0) while the
    validator calibrates and judges on this CPU's, as miners and validators on two CPU generations
    meet at node defaults."""
    out: dict[str, Any] = {}
    for setup in setups(cache_dir, models):
        if train_steps:
            setup = replace(setup, model=train_versions(setup, train_steps, lr)[-1])
        if max_new_tokens:
            setup = replace(setup, params=replace(setup.params, max_new_tokens=max_new_tokens))
        p = setup.params
        mh = manifest_of(setup.model)
        miner_model = copy.deepcopy(setup.model).to(miner_device)
        val_model = copy.deepcopy(setup.model).to(validator_device)
        base = ValidatorConfig(generation=generation_spec(p, groups_per_batch=8), checked_per_group=0)
        with contextlib.ExitStack() as engines:  # the miner's engines close once its rows are done
            mine = _miner_engines(
                engine, miner_isa, miner_model, setup.tokenizer, miner_device, engines, lambda m, name=setup.name: log(f"{name}: {m}")
            )
            if isinstance(mine, str):
                log(f"{setup.name}: skipped: {mine}")
                out[setup.name] = {"skipped": mine, "settings": []}
                continue
            cfg, drift = calibrate(val_model, setup.tokenizer, setup.task, p, mh, base)
            tol = {k: getattr(cfg, k) for k in TOLERANCES}
            log(f"{setup.name}: calibrated {tol} from honest drift {drift}")
            if miner_isa:  # its own process: this one's thread count is not the miner's
                settings = [(b, 0) for b in batch_sizes]
            else:
                settings = [(0, 0)] if mine is not None else [(b, t) for b in batch_sizes for t in threads]
            rows = [
                _judged_row(setup, mh, mine, miner_model, val_model, cfg, bs, th, n_rollouts, log) for bs, th in settings
            ]
        out[setup.name] = {
            "tolerances": tol,
            "calibration_drift": drift,
            "engine": engine,
            "miner_isa": miner_isa or None,
            "devices": {"miner": miner_device, "validator": validator_device},
            "train_steps": train_steps,
            "max_new_tokens": p.max_new_tokens,
            "settings": rows,
        }
    total = sum(r["n"] for m in out.values() for r in m["settings"])
    accepted = sum(r["accepted"] for m in out.values() for r in m["settings"])
    return {"rollouts": total, "accepted": accepted, "false_rejects": total - accepted, "models": out}


def miner_isas() -> tuple[str, ...]:
    """The older CPU generations a miner of ``honest_acceptance`` can run the kernels of."""
    from p2prl.node.weights.isa import ISA_ENV

    return tuple(ISA_ENV)


def _miner_engines(
    engine: str,
    miner_isa: str,
    model: Any,
    tokenizer: Any,
    device: str,
    stack: contextlib.ExitStack,
    log: Callable[[str], None],
) -> Callable[[int], Any] | str | None:
    """The honest miner's engine for a batch size: an older CPU's kernels (``miner_isa``), vLLM
    (batches by itself), or None for transformers' own at each size; a string says why it cannot run.
    What it starts is closed with ``stack``."""
    if miner_isa:
        from p2prl.node.weights.isa import IsaEngine

        older = IsaEngine(miner_isa, model, tokenizer)
        stack.callback(older.close)
        log(f"the miner runs torch's {older.capability} kernels")
        return older.sized
    if engine == "vllm":
        on_vllm = vllm_miner(model, tokenizer, device, stack)
        if isinstance(on_vllm, str):
            return on_vllm
        return lambda _bs: on_vllm
    return None


def _judged_row(
    setup: ModelSetup,
    mh: str,
    mine: Callable[[int], Any] | None,
    miner_model: Any,
    val_model: Any,
    cfg: ValidatorConfig,
    bs: int,
    th: int,
    n_rollouts: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One setting of ``bench honest``: batches mined at engine batch ``bs`` on ``th`` threads (0: the
    default) until ``n_rollouts``, each judged with every rollout recomputed; the largest honest errors."""
    import torch

    from p2prl.rl.engine import HFEngine

    p = setup.params
    v = RolloutValidator.for_model(val_model, setup.tokenizer, setup.task, 5, mh, config=cfg)
    row: dict[str, Any] = {"batch_size": bs, "threads": th, "n": 0, "accepted": 0, "reasons": {}}
    worst = {
        "fingerprint_err_max": 0.0,
        "fingerprint_rms_max": 0.0,
        "fingerprint_err_quantile": 0.0,
        "logprob_err_max": 0.0,
        "sampling_misses": 0,
        "sampling_dist_max": 0.0,
    }
    t0, b = time.perf_counter(), 0
    while row["n"] < n_rollouts:
        idx = list(range(8 * b, 8 * b + 8))
        saved = torch.get_num_threads()
        if th:
            torch.set_num_threads(th)  # the miner's threads; the validator keeps the default
        try:
            eng = mine(bs) if mine is not None else HFEngine(miner_model, setup.tokenizer, max_batch=bs)
            pb = mine_batch(eng, setup.task, 5, mh, MINER_A, idx, GROUP_SIZE, replace(p, seed=b))
        finally:
            if th:
                torch.set_num_threads(saved)
        verdict = v.check(pb.announcement, MINER_A, pb.blob, 5)
        row["n"] += pb.batch.n_rollouts
        row["accepted"] += verdict.accepted_rollouts
        for r, c in verdict.reasons().items():
            row["reasons"][r] = row["reasons"].get(r, 0) + c
        for k in worst:
            worst[k] = max(worst[k], getattr(verdict.stats, k))
        b += 1
    row.update(worst, seconds=time.perf_counter() - t0)
    log(f"  {setup.name:5s} batch {bs:2d} threads {th}: {row['accepted']}/{row['n']} {row}")
    return row


def vllm_miner(model: Any, tokenizer: Any, device: str, stack: contextlib.ExitStack) -> Any:
    """A vLLM miner on ``model`` (written to a temporary directory), or why vLLM cannot run it; the
    engine is closed and the directory removed when ``stack`` closes."""
    import shutil
    import tempfile

    from p2prl.node.weights.engine import VLLMMinerEngine
    from p2prl.rl import open_vllm, vllm_unsupported

    d = Path(tempfile.mkdtemp(prefix="p2prl-honest-vllm-"))
    stack.callback(shutil.rmtree, d, True)
    model.save_pretrained(str(d))
    why = vllm_unsupported(d, device)
    if why is not None:
        return why
    inner = open_vllm(d, tokenizer, device, enforce_eager=not device.startswith("cuda"))
    engine = VLLMMinerEngine(inner, model)
    stack.callback(engine.close)
    return engine
