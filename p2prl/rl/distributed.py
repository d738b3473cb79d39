"""The GRPO learner sharded with FSDP2 under torchrun: one leader (rank 0) and its followers.

A policy whose fp32 masters and AdamW state (16 bytes per parameter) outgrow one device is sharded
with ``torch.distributed.fsdp.fully_shard``: each decoder layer and the root are one FSDP unit, so
masters, gradients and optimizer state are split across the ranks and parameters are gathered
layer by layer for the forward and backward passes. Training is data parallel: every rank receives
the step's rollout groups, takes its share of the rollouts, and FSDP's reduce-scatter sums the
gradients (divide factor 1: the loss is already normalized by the global token count), so a step
equals the single-process step up to float summation order.

Only rank 0 talks to the world (network, chain, files, prints). It drives the others: every
operation on the learner begins with a broadcast naming it (``step``, ``state``, ``save``, ``load``…),
so all ranks enter the same collectives in the same order; followers run :func:`follow` until the
leader says ``stop``. Launched without torchrun, nothing here is used.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from p2prl.patch import changed_fraction
from p2prl.rl.grpo import GRPOConfig, GRPOTrainer, PolicyLearner
from p2prl.rl.model import unique_state, weights_hash

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.dcp"
META_FILE = "p2prl_checkpoint.json"
COLLECTIVE_TIMEOUT_S = 600.0
KEEPALIVE_S = 30.0  # an idle leader pings its followers well inside the collective timeout
PUBLISH_MODES = ("auto", "gather", "sparse")
# auto: sparse shard diffs while fewer than this fraction of bf16 elements changed at the last
# publish, else gather (measured on 2 ranks: sparse 0.40-0.69 s at 3.3% changed, 3.2 s at 41%;
# gather 0.81-0.91 s whatever the fraction; the lines cross near 8%)
AUTO_SPARSE_BELOW = 0.08


def launched() -> bool:
    """True under torchrun (or any launcher that sets the ``RANK``/``WORLD_SIZE`` environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def init() -> None:
    """Join the process group torchrun describes (NCCL on GPUs, gloo on CPU); idempotent."""
    if dist.is_initialized():
        return
    backend = "gloo"
    if torch.cuda.is_available():
        backend = "cuda:nccl,cpu:gloo"  # objects (rollouts, commands) travel on gloo
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))


def shutdown() -> None:
    """Leave the process group. Every rank does before it exits: a process that exits still holding
    one aborts now and then at interpreter teardown ("terminate called without an active exception")."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _bcast(obj: Any = None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_(model: torch.nn.Module) -> None:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, tied head)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None) or []
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum the ranks' gradients: the loss is globally normalized
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)


def _materialize(model: torch.nn.Module, full: Mapping[str, Tensor]) -> None:
    """Give the sharded (possibly meta) model rank 0's weights and buffers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(p.is_meta for p in model.parameters()):  # followers: storage first, values by broadcast
        model.to_empty(device=_device())
    set_model_state_dict(
        model,
        dict(full),
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
    )
    for _, buf in model.named_buffers():  # non-persistent buffers (rotary tables) are not in a state dict
        dist.broadcast(buf, src=0)


class ShardedGRPO(GRPOTrainer):
    """GRPOTrainer on an FSDP2-sharded model: same loss, same step, this rank's share of rollouts."""

    def __init__(
        self, model: Any, config: GRPOConfig, pad_id: int, names: list[str], full: Mapping[str, Tensor]
    ) -> None:
        if config.kl_coef > 0:
            raise ValueError("kl_coef > 0 (a reference model) is not supported with sharding")
        self.names = list(names)  # the unique (untied) tensors, in rank 0's state-dict order
        shard_(model)
        _materialize(model, full)
        super().__init__(model, config, pad_id)
        self._local_prev: dict[str, Tensor] | None = None  # this rank's shard as last handed out (bf16)
        self._full_prev: dict[str, Tensor] | None = None  # rank 0: the full state as last handed out
        self.last_changed: float | None = None  # rank 0: changed fraction of the last tracked publish

    # -- data parallelism (hooks of GRPOTrainer.step) -------------------------------------------------
    def local_rows(self, rows: list[Any]) -> list[Any]:
        """Rollouts ``rank::world``, padded with empty completions to equal counts.

        Every rank must run the same number of forward/backward passes (each gathers parameters);
        an empty completion adds nothing to the loss, the gradient or any statistic.
        """
        w, r = world_size(), rank()
        share = rows[r::w]
        per = -(-len(rows) // w)
        share += [type(rows[0])(rows[0][0], [], [], 0.0)] * (per - len(share))
        return share

    def reduce_totals(self, tot: dict[str, float]) -> None:
        keys = sorted(tot)
        t = torch.tensor([tot[k] for k in keys], dtype=torch.float64, device=_device())
        dist.all_reduce(t)
        for k, v in zip(keys, t.tolist(), strict=True):
            tot[k] = v

    # -- the published bf16 state ---------------------------------------------------------------------
    def _local_bf16(self) -> dict[str, Tensor]:
        sd = self.model.state_dict()
        return {k: _local(sd[k]).detach().to(torch.bfloat16).cpu().clone() for k in self.names}

    def published_state(self, mode: str = "gather", track: bool = False) -> dict[str, Tensor]:
        """The full bf16 state on rank 0 ({} elsewhere), gathered or assembled from sparse shard diffs.

        ``gather``: each tensor's bf16 shards are all-gathered. ``sparse``: each rank compares its
        bf16 shard with the one it last handed out and sends only the changed elements; rank 0
        writes them into its copy of the previous state. Both give bit-identical results.
        ``track`` keeps the sparse path's baseline (and ``last_changed``) current after a gather.
        """
        if mode == "sparse" and self._full_prev is not None:
            return self._assemble_sparse()
        out = self._gather_bf16()
        if mode == "sparse" or track:
            self._local_prev = self._local_bf16()
            if rank() == 0 and self._full_prev is not None:
                self.last_changed = changed_fraction(self._full_prev, out)
            self._full_prev = out if rank() == 0 else {}
        return {k: v.clone() for k, v in out.items()}

    def _gather_bf16(self) -> dict[str, Tensor]:
        from torch.distributed.tensor import DTensor

        sd = self.model.state_dict()
        out: dict[str, Tensor] = {}
        for k in self.names:
            v = sd[k].detach()
            v = v.to(torch.bfloat16)
            full = v.full_tensor() if isinstance(v, DTensor) else v
            if rank() == 0:
                out[k] = full.cpu().contiguous()
        return out

    def _assemble_sparse(self) -> dict[str, Tensor]:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        assert self._local_prev is not None and self._full_prev is not None
        sd = self.model.state_dict()
        new_local = self._local_bf16()
        parts: dict[str, tuple[Tensor, Tensor]] = {}
        for k in self.names:
            a, b = self._local_prev[k], new_local[k]
            idx = torch.ne(a.view(torch.int16), b.view(torch.int16)).flatten().nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            v = sd[k]
            off = 0
            if isinstance(v, DTensor):
                _, goff = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
                off = int(goff[0]) * math.prod(v.shape[1:]) if goff else 0
            parts[k] = (idx + off, b.flatten()[idx])
        self._local_prev = new_local
        gathered: list[Any] = [None] * world_size() if rank() == 0 else []
        dist.gather_object(parts, gathered if rank() == 0 else None, dst=0)
        if rank() != 0:
            return {}
        full = {k: v.clone() for k, v in self._full_prev.items()}
        changed = 0
        for rank_parts in gathered:
            for k, (idx, vals) in rank_parts.items():
                full[k].view(-1)[idx] = vals
                changed += idx.numel()
        self.last_changed = changed / max(1, sum(v.numel() for v in full.values()))
        self._full_prev = full
        return {k: v.clone() for k, v in full.items()}

    def memory(self) -> list[dict[str, float]]:
        """Per rank (on rank 0; [] elsewhere): bytes of this rank's masters and optimizer state, peak RSS."""
        import resource

        mine = {
            "master_mb": sum(_local(p).numel() * _local(p).element_size() for p in self.model.parameters())
            / 2**20,
            "optimizer_state_mb": sum(
                _local(t).numel() * _local(t).element_size()
                for st in self.opt.state.values()
                for t in st.values()
                if isinstance(t, Tensor) and t.dim() > 0
            )
            / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        if torch.cuda.is_available():
            mine["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out: list[Any] = [None] * world_size() if rank() == 0 else []
        dist.gather_object(mine, out if rank() == 0 else None, dst=0)
        return out

    def master_hash(self) -> str:
        """The weights hash of the full fp32 masters, on rank 0 ("" elsewhere): what a restart must restore."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return weights_hash({k: full[k] for k in self.names}) if rank() == 0 else ""

    def load_published(self, state: Mapping[str, Tensor]) -> None:
        """Set the sharded masters from a full (bf16) state held by rank 0."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full = {k: v.float() for k, v in state.items()} if rank() == 0 else {}
        set_model_state_dict(
            self.model,
            full,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
        )
        self._full_prev = self._local_prev = None

    # -- checkpoints (torch.distributed.checkpoint: resharded on load) ------------------------------------
    def save(self, path: Path) -> None:
        """Sharded masters and optimizer state under directory ``path``, swapped in whole on success."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        if rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        msd, osd = get_state_dict(self.model, self.opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
        dist.barrier()
        if rank() == 0:
            meta = {"version": self.version, "world_size": world_size(), "config": vars(self.config)}
            (tmp / META_FILE).write_text(json.dumps(meta, sort_keys=True))
            old = path.with_name(path.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if path.exists():
                path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()

    def load(self, path: Path) -> None:
        """Restore what ``save`` wrote, whatever the number of ranks that wrote it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(path)
        msd, osd = get_state_dict(self.model, self.opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=str(path))
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.version = int(json.loads((path / META_FILE).read_text())["version"])
        self._full_prev = self._local_prev = None


def _local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class Leader:
    """Rank 0's learner: the GRPOTrainer interface, each call announced to the followers first.

    One lock orders the calls (the node's train and publish threads share the learner); an idle
    leader pings the followers so they never hit the collective timeout. A failed collective
    (a rank died) marks the learner broken: every later call raises at once.
    """

    checkpoint_name = CHECKPOINT_NAME

    def __init__(self, learner: ShardedGRPO, publish_mode: str = "auto") -> None:
        self.learner = learner
        self.publish_mode = publish_mode
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.error: BaseException | None = None
        self._ping = threading.Thread(target=self._keepalive, name="p2prl-dist-keepalive", daemon=True)
        self._ping.start()

    @property
    def version(self) -> int:
        return self.learner.version

    @property
    def model(self) -> Any:
        return self.learner.model

    def _call(self, op: str, *args: Any, local: Any = None) -> Any:
        """Announce ``op`` to the followers, then run it here (``local``: rank 0's own part, if it differs)."""
        with self._lock:
            if self.error is not None:
                raise RuntimeError(f"a rank failed earlier: {self.error}")
            if self._closed.is_set():
                raise RuntimeError("the distributed learner is closed")
            try:
                _bcast((op, args))
                return local() if local is not None else _run(self.learner, op, args)
            except BaseException as e:
                self.error = e
                raise

    def step(self, groups: list[Any]) -> dict[str, float]:
        return self._call("step", groups)

    def published_state(self, mode: str | None = None) -> dict[str, Tensor]:
        """The full bf16 state; ``auto`` picks sparse diffs while few elements change (see AUTO_SPARSE_BELOW)."""
        mode = mode or self.publish_mode
        track = self.publish_mode == "auto" or mode == "sparse"
        if mode == "auto":
            last = self.learner.last_changed
            mode = "sparse" if last is not None and last < AUTO_SPARSE_BELOW else "gather"
        return self._call("state", mode, track)

    def save(self, path: Path) -> None:
        self._call("save", str(path))

    def load(self, path: Path) -> None:
        self._call("load", str(path))

    def master_hash(self) -> str:
        return self._call("master")

    def memory(self) -> list[dict[str, float]]:
        return self._call("memory")

    def load_published(self, state: Mapping[str, Tensor]) -> None:
        self._call("load_published", local=lambda: self.learner.load_published(state))  # the state stays here

    def _keepalive(self) -> None:
        while not self._closed.wait(KEEPALIVE_S):
            if self._lock.acquire(blocking=False):
                try:
                    if self.error is None and not self._closed.is_set():
                        _bcast(("ping", ()))
                except BaseException as e:
                    self.error = e
                    log.error("a follower rank is gone: %s", e)
                    return
                finally:
                    self._lock.release()

    def close(self) -> None:
        """Tell the followers to exit (skipped after a failure: they are gone or will time out), then
        leave the process group."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            if self.error is None:
                try:
                    _bcast(("stop", ()))
                except Exception as e:
                    log.warning("followers could not be told to stop: %s", e)
            try:
                shutdown()
            except Exception as e:
                log.warning("could not leave the process group: %s", e)


def _run(learner: ShardedGRPO, op: str, args: tuple[Any, ...]) -> Any:
    if op == "step":
        return learner.step(args[0])
    if op == "state":
        return learner.published_state(*args)
    if op == "memory":
        return learner.memory()
    if op == "save":
        return learner.save(Path(args[0]))
    if op == "load":
        return learner.load(Path(args[0]))
    if op == "load_published":
        return learner.load_published({})
    if op == "master":
        return learner.master_hash()
    if op == "ping":
        return None
    raise ValueError(f"unknown learner op {op!r}")


def master_hash(learner: Any) -> str:
    """The fp32 master weights' hash of a learner, sharded or not."""
    if isinstance(learner, Leader):
        return learner.master_hash()
    return weights_hash(unique_state(learner.model))


def make_learner(model: Any, config: GRPOConfig, pad_id: int, publish_mode: str = "auto") -> PolicyLearner:
    """A GRPOTrainer in one process; under torchrun, rank 0's :class:`Leader` (followers: :func:`follow`).

    Rank 0 holds the loaded model; it sends the followers the architecture and the GRPO settings,
    they build the model on the meta device and receive the weights by broadcast while sharding.
    """
    if not launched():
        return GRPOTrainer(model, config, pad_id)
    if publish_mode not in PUBLISH_MODES:
        raise ValueError(f"publish mode must be one of {PUBLISH_MODES}")
    init()
    full = {k: v.float() for k, v in unique_state(model).items()}
    _bcast((model.config, config, pad_id, list(full)))
    return Leader(ShardedGRPO(model.float(), config, pad_id, list(full), full), publish_mode)


def follow() -> None:
    """A follower rank: build the sharded learner from rank 0's description, run its ops until ``stop``."""
    from transformers import AutoModelForCausalLM

    init()
    hf_config, config, pad_id, names = _bcast()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    learner = ShardedGRPO(model, config, pad_id, names, {})
    while True:
        op, args = _bcast()
        if op == "stop":
            shutdown()
            return
        _run(learner, op, args)
