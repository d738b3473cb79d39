"""A version switch applied inside vLLM's worker, through vLLM's own weight-update path.

vLLM turns a layer's checkpoint weights into a kernel format at load (``process_weights_after_loading``).
On the CPU its linear layers are packed for the machine (``dispatch_cpu_unquantized_gemm``: oneDNN on
any x86, the sgl AMX kernel for small weights on AMX, zentorch on AMD Zen with zentorch) and the
checkpoint weight is dropped (an empty parameter); embeddings keep their weight but carry a packed
copy for their use as the LM head. A write into the parameter alone would either fail (``Attempted to
load weight … into parameter (torch.Size([0]))``) or leave the packed copy stale. So each module a
switch touches takes one of two ways, decided from vLLM's own record of the checkpoint layout:

- **packed** (its kernel tensors differ from the checkpoint's in shape or dtype): vLLM's layerwise
  reload lifecycle for that module alone (``initialize_layerwise_reload`` → dense checkpoint patches
  of *every* shard the module loads → ``finalize_layerwise_reload``), which re-runs the module's
  processing, so the packed copy is rebuilt from the new weights. vLLM no longer holds these
  weights, so the engine keeps their checkpoint tensors (``VLLMEngine``'s master copy).
- **live** (kernel tensors in checkpoint format: every layer on CUDA, norms and embeddings on the
  CPU): vLLM's sparse checkpoint-patch loader writes only the changed positions in place, then each
  module holding a written parameter has its processing re-run, which rebuilds any copy derived from
  it (the tied LM head's packed copy on the CPU; nothing on CUDA, where it is a no-op).

Everything here runs in the worker (``collective_rpc``; in-process, so tensors pass by reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: the vLLM releases whose layerwise-reload internals (``_kernel_differs``) this was written against
KNOWN_VLLM = ("0.32.",)


@dataclass(frozen=True)
class TensorChange:
    """One checkpoint tensor's new values: the whole tensor (``indices`` None, ``values`` in its
    shape) or the values at flat ``indices`` (int64, unique) of it."""

    name: str
    values: Tensor
    indices: Tensor | None = None
    shape: tuple[int, ...] | None = None  # the whole tensor's, for a sparse change (else known to the engine)


@dataclass(frozen=True)
class Switch:
    """A version switch as a value: the version, its weights hash and what changed."""

    version: int
    hash: str
    changes: tuple[TensorChange, ...]


@dataclass(frozen=True)
class Slot:
    """Where a checkpoint tensor lands in the engine: its module, whether that module is packed, and
    every checkpoint tensor the module loads (a packed module is reloaded from all of them)."""

    module: str
    packed: bool
    shards: tuple[str, ...]


class VLLMLayoutError(RuntimeError):
    """vLLM's model does not expose what an in-place switch needs."""


def worker_model(worker: Any) -> Any:
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def _kernel_differs(module: torch.nn.Module) -> bool:
    """True when the module's kernel tensors are not its checkpoint tensors (packed, re-typed).

    The one dependence on vLLM internals: the checkpoint layout vLLM records at model creation
    (``record_metadata_for_reloading``) for its layerwise reload, read through ``get_layerwise_info``.
    """
    import vllm

    try:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    except ImportError as e:
        raise VLLMLayoutError(
            f"vLLM {vllm.__version__} has no layerwise reload (written against {KNOWN_VLLM}): {e}"
        ) from e
    params, _ = get_layerwise_info(module).restore_metadata
    live = {n: p for n, p in module._parameters.items() if p is not None}
    if not params:
        if any(p.numel() == 0 for p in live.values()):
            raise VLLMLayoutError(
                f"vLLM {vllm.__version__} recorded no checkpoint layout for a packed "
                f"{type(module).__name__} (written against {KNOWN_VLLM})"
            )
        return False
    for n, meta in params.items():
        p = live.get(n)
        if p is None or tuple(p.shape) != tuple(meta.shape) or p.dtype != meta.dtype:
            return True
    return False


def _module_of(name: str, mapping: dict[str, list[str]]) -> tuple[str, list[str], str, str]:
    """(module path, its shard names, the parent path, the leaf) of checkpoint tensor ``name``."""
    mod, _, leaf = name.rpartition(".")
    parent, _, last = mod.rpartition(".")
    fused, shards = next(((f, list(s)) for f, s in mapping.items() if last in s), (last, [last]))
    return (f"{parent}.{fused}" if parent else fused), shards, parent, leaf


def layout_rpc(worker: Any, names: list[str]) -> dict[str, Slot]:
    """Runs in the worker: each checkpoint tensor's ``Slot`` (absent: no module of the model takes it)."""
    model = worker_model(worker)
    mapping = dict(getattr(model, "packed_modules_mapping", {}) or {})
    out: dict[str, Slot] = {}
    for name in names:
        path, shards, parent, _ = _module_of(name, mapping)
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue  # not a tensor this model loads (the engine refuses a switch that carries it)
        leaves = sorted({n for n, p in module._parameters.items() if p is not None})
        pre = f"{parent}." if parent else ""
        out[name] = Slot(path, _kernel_differs(module), tuple(f"{pre}{s}.{lf}" for s in shards for lf in leaves))
    return out


def apply_rpc(
    worker: Any,
    packed: list[tuple[str, Tensor]],
    packed_modules: list[str],
    live: list[tuple[str, tuple[int, ...], Tensor, Tensor]],
) -> int:
    """Runs in the worker. ``packed``: every checkpoint tensor of ``packed_modules``, whole;
    ``live``: (name, checkpoint shape, flat indices, values) of live tensors. Returns tensors written."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.checkpoint_weight_patch import (
        CheckpointWeightPatch,
        load_checkpoint_weight_patches,
    )
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    model = worker_model(worker)
    dev = next(p for p in model.parameters() if p.numel()).device
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        if live:
            patches = [
                CheckpointWeightPatch(n, shape, v.dtype, v.to(dev).reshape(-1), i.to(dev))
                for n, shape, i, v in live
            ]
            written = load_checkpoint_weight_patches(model, patches, validate_unique_indices=False)
            _reprocess_holders(model, written)
        if packed:
            mods = [model.get_submodule(p) for p in packed_modules]
            for m in mods:
                initialize_layerwise_reload(m)
            try:
                dense = [CheckpointWeightPatch(n, tuple(t.shape), t.dtype, t.to(dev).reshape(-1)) for n, t in packed]
                load_checkpoint_weight_patches(model, dense)
            finally:
                for m in mods:
                    finalize_layerwise_reload(m, worker.vllm_config.model_config)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return len(packed) + len(live)


def _reprocess_holders(model: torch.nn.Module, written: set[str]) -> None:
    """Re-run the processing of every module holding a written parameter (a tied LM head included),
    so whatever it derived from the weight (a packed copy on the CPU) is rebuilt."""
    params = dict(model.named_parameters(remove_duplicate=False))
    ids = {id(params[n]) for n in written if n in params}
    if not ids:
        return
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if qm is not None and any(id(p) in ids for p in m._parameters.values() if p is not None):
            qm.process_weights_after_loading(m)


def read_params_rpc(worker: Any, names: list[str] | None) -> dict[str, Tensor]:
    """Runs in the worker: copies of the named parameters (all when ``names`` is None)."""
    params = dict(worker_model(worker).named_parameters())
    want = list(params) if names is None else names
    return {n: params[n].detach().to("cpu", copy=True) for n in want}


def packed_mapping_rpc(worker: Any) -> dict[str, list[str]]:
    return dict(getattr(worker_model(worker), "packed_modules_mapping", {}) or {})
