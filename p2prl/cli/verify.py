"""``p2prl verify-batch``: re-run a validator's judgement of one rollout batch and print every figure.

What an operator runs when a miner disputes a rejection: the batch blob (from a data directory's blob
store or a file), its signed announcement (from the node's journal, a file, or — lacking both —
rebuilt unsigned from the blob's own header), the genesis, and the weights of the batch's version (the
base model for version 0, else a saved ``v<version>.safetensors`` under the data directory or a file).
With the validator's key the positions and rollouts it checked are the ones it picked (docs/PROTOCOL.md
§11.7); without it every position of every rollout is recomputed, a stricter check an honest batch
still passes. Tolerances are calibrated on this machine's engine as a validator node does at start.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import typer

VERDICT_FIGURES = (
    ("fingerprint_err_quantile", "fingerprint_tol", "fingerprint: 90th percentile of per-position errors"),
    ("fingerprint_err_max", "fingerprint_tol_rollout", "fingerprint: worst rollout's rms error (largest eighth left out)"),
    ("logprob_err_max", "logprob_fail_at", "behaviour logprob: largest per-token error past rounding"),
    ("sampling_dist_max", "sampling_margin", "sampling: farthest uniform outside its token's interval"),
)


class VerifyError(Exception):
    """Something verify-batch needs is missing or does not match (a usage error, exit 2)."""


def miss_threshold(n: int, rate: float, alpha: float) -> int:
    """The fewest sampling misses among ``n`` tokens that fail a batch (docs/PROTOCOL.md §10)."""
    from p2prl.proof import failing_count

    return failing_count(n, rate, alpha)


def _announcement(
    data_dir: Path, blob_id: str, blob: bytes, network: str, given: Path | None, chunk_size: int
) -> tuple[Any, bytes, str]:
    """(announcement, miner key, where it came from)."""
    from p2prl.node import JOURNAL_DIR, find_envelopes
    from p2prl.proof import BatchLimits, commitment_root, decode_batch
    from p2prl.protocol import RolloutAnnouncement, blob_ref_for, decode_message

    raws: list[bytes] = []
    if given is not None:
        data = given.read_bytes()
        try:
            data = bytes.fromhex(data.decode().strip())
        except ValueError:
            pass
        raws, source = [data], str(given)
    else:
        raws, source = find_envelopes(data_dir / JOURNAL_DIR, blob_id, RolloutAnnouncement.TYPE), "journal"
    for raw in reversed(raws):
        env, msg = decode_message(raw, network, expected_type=RolloutAnnouncement.TYPE)
        if msg.blob.id == blob_id:
            return msg, env.signer, f"{source} (signed by {env.signer_hex[:16]}…)"
    if given is not None:
        raise VerifyError(f"{given} is no announcement of blob {blob_id}")
    batch = decode_batch(blob, BatchLimits(vocab_size=1 << 30))
    ann = RolloutAnnouncement(
        version=batch.version,
        manifest_hash=batch.manifest_hash,
        blob=blob_ref_for(blob, chunk_size),
        groups=len(batch.groups),
        commitment_root=commitment_root(batch),
    )
    return ann, batch.miner, "none found: rebuilt unsigned from the blob's header (commitment not checked)"


def _receipts(data_dir: Path, sg: Any, digest: str) -> frozenset[str] | None:
    """The entries of the trainer's receipts list of ``digest`` in the node's journal (a chained
    batch's seed is read from it), verified as the genesis trainer's; None when not journaled."""
    from p2prl.node import JOURNAL_DIR, find_by_digest
    from p2prl.protocol import Receipts, decode_message

    raw = find_by_digest(data_dir / JOURNAL_DIR, Receipts.TYPE, digest)
    if raw is None:
        return None
    _, msg = decode_message(raw, sg.network_id, expected_type=Receipts.TYPE, allowed_signers={sg.trainer_key})
    assert isinstance(msg, Receipts)
    return frozenset(msg.entries)


def _model_for(g: Any, version: int, data_dir: Path, model_dir: Path | None, cache: Path, weights: Path | None) -> Any:
    """(model, tokenizer, weights hash) of ``version``."""
    from p2prl.rl import build_default_model, load_tokenizer, load_weights_model, unique_state, weights_hash

    path = model_dir if model_dir is not None else None
    if path is None:
        if g.model.source != "builtin":
            raise VerifyError("the genesis model is an hf directory: pass --model DIR")
        path = build_default_model(cache)
    model = load_weights_model(path)
    if weights is None and version > 0:
        found = sorted(data_dir.glob(f"**/weights/v{version:012d}.safetensors"))
        if not found:
            raise VerifyError(f"no weights of version {version} under {data_dir}: pass --weights FILE")
        weights = found[-1]
    if weights is not None:
        from safetensors.torch import load_file

        state = load_file(str(weights))
        _, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise VerifyError(f"{weights}: tensors the model does not have: {unexpected[:3]}")
    tok = load_tokenizer(path, g.prompt.format, g.prompt.system, g.generation.stop_token_ids)
    return model.eval(), tok, weights_hash(unique_state(model))


def verify(
    batch_id: str,
    data_dir: Path,
    network_file: Path,
    blob_file: Path | None = None,
    announcement_file: Path | None = None,
    model_dir: Path | None = None,
    model_cache: Path | None = None,
    weights: Path | None = None,
    key_file: Path | None = None,
    calibrate: bool = True,
    current_version: int | None = None,
) -> dict[str, Any]:
    """The judgement as a record: verdict per group, every check's figure against its tolerance."""
    from p2prl.crypto import load_identity
    from p2prl.node import position_secret, read_genesis
    from p2prl.proof import RolloutValidator, ValidatorConfig, calibrate_tolerances
    from p2prl.rl import GenerationParams, get_task
    from p2prl.store import BlobStore

    sg = read_genesis(network_file)
    g = sg.genesis
    if blob_file is not None:
        blob = blob_file.read_bytes()
    else:
        store = BlobStore(data_dir / "blobs")
        if not store.has(batch_id):
            raise VerifyError(f"blob {batch_id} is not in {data_dir / 'blobs'}: pass --blob FILE")
        blob = store.get(batch_id)
    ann, miner, ann_source = _announcement(data_dir, batch_id, blob, g.network_id, announcement_file, g.patch.chunk_size)
    model, tok, held_hash = _model_for(g, ann.version, data_dir, model_dir, model_cache or data_dir / "model", weights)
    task = get_task(g.task.name, **dict(g.task.params))
    gen = g.generation
    if key_file is not None:
        secret = position_secret(load_identity(key_file))
        cfg = ValidatorConfig.from_genesis(g, contiguous_indices=False)
        picks = "the validator's own (its key)"
    else:
        secret = b""
        cfg = ValidatorConfig.from_genesis(g, contiguous_indices=False, checked_per_group=0, positions_per_rollout=0)
        picks = "every rollout and position (no validator key given)"
    if calibrate:
        params = GenerationParams(gen.max_new_tokens, gen.temperature, gen.top_p)
        cfg, _ = calibrate_tolerances(model, tok, task, params, held_hash, cfg)
        cfg = replace(cfg, contiguous_indices=False)
    checker = RolloutValidator(
        lambda v: (held_hash, model) if v == ann.version else None,
        tok,
        task,
        cfg,
        position_secret=secret or None,
        receipts=partial(_receipts, data_dir, sg),
    )
    bv = checker.check(ann, miner, blob, ann.version if current_version is None else current_version)
    stats = bv.stats.to_dict()
    n = int(stats["sampling_tokens"])
    return {
        "batch": batch_id,
        "miner": miner.hex(),
        "version": ann.version,
        "announcement": ann_source,
        "weights_hash": held_hash,
        "picks": picks,
        "tolerances": "calibrated on this engine" if calibrate else "uncalibrated defaults",
        "accepted_groups": sum(gv.accepted for gv in bv.groups),
        "groups": [{"index": gv.index, "accepted": gv.accepted, "reason": gv.reason} for gv in bv.groups],
        "hard_failure": bv.hard_failure,
        "stats": stats,
        "limits": {
            "fingerprint_tol": cfg.fingerprint_tol,
            "fingerprint_tol_rollout": cfg.fingerprint_tol_rollout,
            "logprob_tol_mean": cfg.logprob_tol_mean,
            "logprob_tol_max": cfg.logprob_tol_max,
            "logprob_fail_at": cfg.logprob_fail_at,
            "sampling_margin": cfg.sampling_margin,
            "sampling_fail_at_misses": miss_threshold(n, cfg.sampling_miss_rate, cfg.sampling_alpha) if n else 0,
            "sampling_rung_logp": math.log(cfg.sampling_alpha / max(1, len(cfg.sampling_rungs))),
            "distribution_alpha": cfg.distribution_alpha,
            "distribution_batch_alpha": cfg.distribution_batch_alpha,
        },
    }


def render(rec: dict[str, Any]) -> list[str]:
    s, lim = rec["stats"], rec["limits"]
    lines = [
        f"batch {rec['batch']}",
        f"  miner {rec['miner']}, version {rec['version']}, weights {rec['weights_hash']}",
        f"  announcement: {rec['announcement']}",
        f"  checked: {rec['picks']}; tolerances {rec['tolerances']}",
        f"  rollouts recomputed {int(s['rollouts_recomputed'])} of {int(s['rollouts_picked'])} picked",
    ]
    for stat, tol, label in VERDICT_FIGURES:
        lines.append(f"  {label}: {s[stat]:.6g} (limit {lim[tol]:.6g})")
    lines += [
        f"  sampling: {int(s['sampling_misses'])} misses in {int(s['sampling_tokens'])} tokens"
        f" (the batch fails at {lim['sampling_fail_at_misses']})",
        f"  sampling inside the margin: least likely rung log p {s['sampling_rung_logp']:.4g}"
        f" (limit {lim['sampling_rung_logp']:.4g})",
        f"  distribution: least likely rollout log p {s['distribution_logp_min']:.4g}"
        f" (limit {math.log(lim['distribution_alpha']):.4g}), batch {s['distribution_batch_logp']:.4g}"
        f" (limit {math.log(lim['distribution_batch_alpha']):.4g})",
        f"verdict: {rec['accepted_groups']}/{len(rec['groups'])} groups accepted"
        + (", hard failure" if rec["hard_failure"] else ""),
    ]
    lines += [f"  group {g['index']}: {'accepted' if g['accepted'] else 'rejected'} ({g['reason']})" for g in rec["groups"]]
    return lines


def verify_batch(
    batch_id: str = typer.Argument(..., help="The batch's blob id (sha256 hex, as the announcement names it)."),
    data_dir: Path = typer.Option(Path("p2prl-data"), "--data-dir", help="The node's data directory."),
    network: Path = typer.Option(..., "--network", help="The genesis file."),
    blob: Path | None = typer.Option(None, "--blob", help="The blob's bytes, if not in the data dir's store."),
    announcement: Path | None = typer.Option(
        None, "--announcement", help="The signed announcement envelope (bytes or hex), if not in the journal."
    ),
    model: Path | None = typer.Option(None, "--model", help="The genesis model's HF directory (hf models)."),
    model_cache: Path | None = typer.Option(None, "--model-cache", help="Default: <data-dir>/model."),
    weights: Path | None = typer.Option(None, "--weights", help="The version's safetensors (else searched)."),
    key: Path | None = typer.Option(None, "--key", help="The validator's key file: repeat its own picks."),
    calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate", help="Calibrate tolerances first."),
    current_version: int | None = typer.Option(None, "--current-version", help="Default: the batch's own."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Re-run a validator's judgement of one rollout batch and print every check's figure.

    Exit status 0 when every group is accepted, 1 when any is rejected, 2 when something is missing.
    """
    from p2prl.errors import PeerInputError
    from p2prl.node import GenesisError

    try:
        rec = verify(
            batch_id, data_dir, network, blob, announcement, model, model_cache, weights, key, calibrate, current_version
        )
    except (VerifyError, GenesisError, PeerInputError, OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(rec, sort_keys=True) if json_out else "\n".join(render(rec)))
    raise typer.Exit(0 if rec["accepted_groups"] == len(rec["groups"]) else 1)
