"""Single-process loop: generate → reward → replay buffer → GRPO → bf16 publish, for the default demo.

It runs the same pieces a network runs — miners sample from the bf16 published weights, the trainer
steps fp32 master weights — without any transport, so learning can be checked on one machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from p2prl.patch import changed_fraction
from p2prl.rl import distributed
from p2prl.rl.buffer import ReplayBuffer
from p2prl.rl.cpu import torch_threads
from p2prl.rl.distributed import make_learner, master_hash, world_size
from p2prl.rl.engine import GenerationParams, HFEngine, copy_state_in_place
from p2prl.rl.engines import choose_engine, open_vllm
from p2prl.rl.evaluate import greedy_success
from p2prl.rl.grpo import GRPOConfig
from p2prl.rl.model import DIGITS, build_default_model, load_model, pick_device
from p2prl.rl.modeldir import stop_ids_of
from p2prl.rl.tasks import derive_seed, get_task
from p2prl.rl.tokenizer import load_tokenizer
from p2prl.rl.types import Rollout, RolloutGroup

log = logging.getLogger(__name__)

DEFAULT_LR = 3e-4


def default_cache_dir() -> Path:
    """``$P2PRL_CACHE`` or ``~/.cache/p2prl``: where built models live."""
    return Path(os.environ.get("P2PRL_CACHE", Path.home() / ".cache" / "p2prl"))


@dataclass
class LocalConfig:
    minutes: float = 5.0
    max_steps: int | None = None
    lr: float = DEFAULT_LR
    seed: int = 0
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = DIGITS + 2
    eval_every: int = 0
    eval_problems: int = 256
    cache_dir: Path = field(default_factory=default_cache_dir)
    model_dir: Path | None = None  # a local HF directory (default: the built-in model)
    task: str = "addition"
    task_params: dict[str, Any] = field(default_factory=lambda: {"digits": DIGITS})
    prompt_format: str = "raw"
    system_prompt: str = ""
    device: str = "cpu"  # auto, cpu, cuda or cuda:N
    engine: str = "auto"  # rollout engine: auto (vLLM where installed, on CUDA), hf or vllm
    threads: int = 0  # torch intra-op threads for the run; 0: p2prl.rl.cpu.default_threads() (1)
    resume: Path | None = None  # a checkpoint to start from (masters, optimizer, version)
    save: Path | None = None  # where to checkpoint at the end (a directory under torchrun)


def version_hash(seed: int, version: int) -> str:
    """Stand-in for a manifest hash in the local loop: distinct per (run seed, version)."""
    return hashlib.sha256(f"p2prl-local:{seed}:{version}".encode()).hexdigest()


def train_local(
    cfg: LocalConfig, on_step: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any] | None:
    """Run until ``minutes`` or ``max_steps``; returns the summary (see ``p2prl train-local --json``).

    Runs with ``cfg.threads`` torch threads (one by default: see ``p2prl.rl.cpu``), restored after.
    Under torchrun the learner is sharded over the ranks (``p2prl.rl.distributed``): rank 0 runs the
    loop and returns the summary, the other ranks serve its learner and return None.
    """
    with torch_threads(cfg.threads) as threads:
        if distributed.launched() and distributed.rank() != 0:
            distributed.follow()
            return None
        summary = _train_local(cfg, on_step)
    summary["threads"] = threads
    return summary


def _train_local(cfg: LocalConfig, on_step: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)

    model_dir = cfg.model_dir or build_default_model(cfg.cache_dir)
    task = get_task(cfg.task, **cfg.task_params)
    device = pick_device(cfg.device)
    master, raw = load_model(model_dir, dtype=torch.float32)
    tok = load_tokenizer(model_dir, cfg.prompt_format, cfg.system_prompt, stop_ids_of(model_dir, raw.tok))
    master = master.to(device)
    policy = load_model(model_dir, dtype=torch.bfloat16)[0].to(device)
    trainer = make_learner(master, GRPOConfig(lr=cfg.lr, temperature=cfg.temperature), tok.pad_id)
    try:
        resumed: dict[str, Any] = {}
        if cfg.resume is not None:
            trainer.load(cfg.resume)
            resumed = {"resumed_version": trainer.version, "master_hash_start": master_hash(trainer)}
        summary = _loop(cfg, on_step, model_dir, task, tok, policy, trainer)
        if cfg.save is not None:
            trainer.save(cfg.save)
        return {**summary, **resumed, "master_hash": master_hash(trainer)}
    finally:
        close = getattr(trainer, "close", None)
        if close is not None:
            close()


def _loop(
    cfg: LocalConfig,
    on_step: Callable[[dict[str, Any]], None] | None,
    model_dir: Path,
    task: Any,
    tok: Any,
    policy: Any,
    trainer: Any,
) -> dict[str, Any]:
    choice = choose_engine(cfg.engine, str(next(policy.parameters()).device), Path(model_dir))
    if choice.notice:
        log.warning("%s", choice.notice)
    engine: Any = HFEngine(policy, tok, return_hidden=False)
    if choice.name == "vllm":  # generates; ``policy`` (kept in step) serves the greedy evaluation
        dev = str(next(policy.parameters()).device)
        engine = open_vllm(Path(model_dir), tok, dev, enforce_eager=not dev.startswith("cuda"))
    buffer = ReplayBuffer(max_staleness=2, half_life=1.0, capacity_groups=8 * cfg.prompts_per_step)
    published = trainer.published_state()
    engine.load_state_dict(published)
    miner_key = b"local-miner"
    history: list[dict[str, Any]] = []
    fractions: list[float] = []
    t_eval = time.monotonic()
    greedy_first = greedy_success(policy, tok, task, cfg.eval_problems, cfg.max_new_tokens)
    greedy_last = greedy_first
    timing = {"eval_s": time.monotonic() - t_eval, "generate_s": 0.0, "step_s": 0.0}
    skipped = 0
    t0 = time.monotonic()
    deadline = t0 + cfg.minutes * 60
    step = 0
    while time.monotonic() < deadline and (cfg.max_steps is None or step < cfg.max_steps):
        version = trainer.version
        vh = version_hash(cfg.seed, version)
        problems = [task.problem(derive_seed(vh, miner_key, i)) for i in range(cfg.prompts_per_step)]
        prompts = [tok.encode_prompt(p.prompt) for p in problems]
        params = GenerationParams(
            cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed=cfg.seed * 1_000_003 + step
        )
        t_gen = time.monotonic()
        samples = engine.generate(prompts, cfg.samples_per_prompt, params)
        t_step = time.monotonic()
        rewards = []
        equal = 0
        for prob, pid, group in zip(problems, prompts, samples, strict=True):
            rolls = [
                Rollout(s.completion_ids, s.logprobs, task.reward(prob, tok.decode(s.completion_ids)))
                for s in group
            ]
            rewards.extend(r.reward for r in rolls)
            equal += len({r.reward for r in rolls}) == 1
            buffer.add(RolloutGroup(pid, rolls, version=version, miner="local", problem=prob))
        stats = trainer.step(buffer.sample(trainer.version, cfg.prompts_per_step))
        timing["generate_s"] += t_step - t_gen
        timing["step_s"] += time.monotonic() - t_step
        step += 1
        skipped += bool(stats["skipped"])
        rec: dict[str, Any] = {
            "step": step,
            "version": version,
            "elapsed_s": time.monotonic() - t0,
            "reward": sum(rewards) / len(rewards),
            "equal_groups": equal / len(problems),
            **{k: stats[k] for k in ("loss", "clip_frac", "grad_norm", "skipped")},
        }
        if not stats["skipped"]:
            new = trainer.published_state()
            frac = changed_fraction(published, new)
            fractions.append(frac)
            if choice.name == "vllm":  # only the tensors that changed go into the engine
                copy_state_in_place(policy, new)
                engine.update(new, [k for k in new if not torch.equal(new[k], published[k])])
            else:
                engine.load_state_dict(new)
            published = new
            rec["changed_fraction"] = frac
        if cfg.eval_every and step % cfg.eval_every == 0:
            t_eval = time.monotonic()
            greedy_last = greedy_success(policy, tok, task, cfg.eval_problems, cfg.max_new_tokens)
            timing["eval_s"] += time.monotonic() - t_eval
            rec["greedy"] = greedy_last
        history.append(rec)
        if on_step:
            on_step(rec)
    if not cfg.eval_every or (history and "greedy" not in history[-1]):
        greedy_last = greedy_success(policy, tok, task, cfg.eval_problems, cfg.max_new_tokens)
    tail = history[-max(1, len(history) // 10) :]
    return {
        "steps": step,
        "versions": trainer.version,
        "elapsed_s": time.monotonic() - t0,
        "seconds_per_step": (time.monotonic() - t0) / step if step else None,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "reward_first": history[0]["reward"] if history else None,
        "reward_last": history[-1]["reward"] if history else None,
        "reward_last_10pct": sum(r["reward"] for r in tail) / len(tail) if tail else None,
        "greedy_first": greedy_first,
        "greedy_last": greedy_last,
        "eval_problems": cfg.eval_problems,
        "steps_skipped": skipped,
        # a run whose every step was skipped learned nothing: say so rather than report 0 → 0 silently
        "notice": "every step skipped: all groups' rewards were equal (no GRPO signal)"
        if step and skipped == step
        else "",
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "max_new_tokens": cfg.max_new_tokens,
        "prompt_format": cfg.prompt_format,
        "task_params": cfg.task_params,
        "changed_fraction_mean": sum(fractions) / len(fractions) if fractions else 0.0,
        "changed_fraction_first": fractions[0] if fractions else 0.0,
        "rollouts_per_step": cfg.prompts_per_step * cfg.samples_per_prompt,
        "world_size": world_size(),
        "first_loss": history[0]["loss"] if history else None,
        "model_dir": str(model_dir),
        "engine": choice.name,
        "history": history,
    }
