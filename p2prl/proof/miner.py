"""The miner's side of the proof: generate groups for derived prompts, score them, commit, announce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2prl.proof.batch import RolloutBatch, build_batch, commitment_root, encode_batch
from p2prl.protocol import RolloutAnnouncement, blob_ref_for, chain_seed
from p2prl.rl import derive_seed, sample_key


@dataclass
class PreparedBatch:
    batch: RolloutBatch
    blob: bytes
    announcement: RolloutAnnouncement


def announce(batch: RolloutBatch, chain: tuple[str, str] | None = None) -> PreparedBatch:
    """Encode a batch and the RolloutAnnouncement (to be signed by the miner) that names it
    (``chain``: the previous blob id and the receipts digest a chained batch follows)."""
    blob = encode_batch(batch)
    prev, receipts = chain if chain is not None else ("", "")
    ann = RolloutAnnouncement(
        version=batch.version,
        manifest_hash=batch.manifest_hash,
        blob=blob_ref_for(blob),
        groups=len(batch.groups),
        commitment_root=commitment_root(batch),
        prev=prev,
        receipts=receipts,
    )
    return PreparedBatch(batch, blob, ann)


def sample_keys(manifest_hash: str, miner_key: bytes, indices: list[int], group_size: int) -> list[list[bytes]]:
    """The sample keys of a batch: ``[prompt][sample]`` for the miner's prompt ``indices``."""
    return [[sample_key(manifest_hash, miner_key, i, j) for j in range(group_size)] for i in indices]


def mine_batch(
    engine: Any,
    task: Any,
    version: int,
    manifest_hash: str,
    miner_key: bytes,
    indices: list[int],
    group_size: int,
    params: Any,
    chain: tuple[str, str] | None = None,
) -> PreparedBatch:
    """Generate ``group_size`` completions for each of the miner's derived prompts ``indices``, each
    token drawn from its public uniform (``sample_keys``). ``chain`` (previous blob id, receipts
    digest): a chained batch, its prompts and uniforms seeded by ``chain_seed`` of the two."""
    tok = engine.tokenizer
    seed = chain_seed(chain[1], chain[0]) if chain is not None else manifest_hash
    problems = [task.problem(derive_seed(seed, miner_key, i)) for i in indices]
    prompts = [tok.encode_prompt(p.prompt) for p in problems]
    samples = engine.generate(prompts, group_size, params, sample_keys(seed, miner_key, indices, group_size))
    groups = []
    for i, prob, prompt, group in zip(indices, problems, prompts, samples, strict=True):
        rewards = [task.reward(prob, tok.decode(s.completion_ids)) for s in group]
        groups.append((i, prompt, group, rewards))
    batch = build_batch(version, manifest_hash, miner_key, groups, seed=seed if chain is not None else "")
    return announce(batch, chain)
