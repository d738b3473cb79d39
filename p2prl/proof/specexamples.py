"""Worked examples of what a miner puts in a rollout batch, computed by the code a validator runs.

docs/PROTOCOL.md §12 prints them (``python -m p2prl.proof.specexamples`` renders that section) and a
test keeps the two equal, so a second implementation can check its prompt derivation (every built-in
task), fingerprint sketches, batch payload and commitment root against these byte for byte.
"""

from __future__ import annotations

import hashlib
import math
import struct

import blake3
import numpy as np

from p2prl.proof.batch import (
    MAGIC,
    GroupRecord,
    RolloutBatch,
    RolloutRecord,
    commitment_root,
    encode_batch,
    rollout_leaf,
)
from p2prl.proof.fingerprint import DOMAIN, SCALE, SKETCH_DIM, projection, sketch
from p2prl.rl import CharTokenizer, derive_seed, get_task

SECTION = "## 12. Worked examples: prompts, fingerprints, the batch blob"
WRAP = 96  # hex characters per line
MANIFEST_HASH = "ab" * 32
MINER = bytes(range(32))
VERSION = 7
# a hidden state of width 8 (bf16 values: what a bf16 model's final norm produces)
HIDDEN = [[0.5, -1.25, 2.0, 0.0, -0.375, 1.5, -3.0, 0.8125], [1.0, 1.0, -1.0, 0.25, 0.0, -0.5, 2.5, -2.0]]


def task_draws(seed: bytes, n: int) -> list[int]:
    """``seed_ints`` as the spec writes it (the test checks it against the tasks' own)."""
    return [
        int.from_bytes(hashlib.sha256(b"p2prl-task" + seed + i.to_bytes(4, "big")).digest()[:8], "big")
        for i in range(n)
    ]


def wrap(hexstr: str) -> list[str]:
    return [hexstr[i : i + WRAP] for i in range(0, len(hexstr), WRAP)] or [""]


def example_batch() -> RolloutBatch:
    """Two groups (prompt indices 5 and 6) of short completions: three rollouts, so the Merkle tree
    has an odd node. (A real batch has ``group_size`` rollouts in every group.)"""
    tok = CharTokenizer()
    task = get_task("addition", digits=2)
    groups = []
    completions = {5: [("55", -0.5), ("9", -1.25)], 6: [("100", -0.0625)]}
    rng_h = np.array(HIDDEN * 2, dtype=np.float32)
    for index, comps in completions.items():
        prob = task.problem(derive_seed(MANIFEST_HASH, MINER, index))
        recs = []
        for text, lp in comps:
            ids = [*tok.encode(text), tok.eos_id]
            hid = rng_h[: len(ids)] * (1 + 0.25 * len(recs))
            recs.append(
                RolloutRecord(
                    completion_ids=np.array(ids, dtype=np.uint32),
                    logprobs=np.full(len(ids), lp, dtype=np.float32),
                    reward=task.reward(prob, text),
                    sketches=sketch(hid, MANIFEST_HASH),
                )
            )
        groups.append(GroupRecord(index, np.array(tok.encode_prompt(prob.prompt), dtype=np.uint32), recs))
    return RolloutBatch(VERSION, MANIFEST_HASH, MINER, groups, SKETCH_DIM)


def payload_lines(batch: RolloutBatch) -> list[str]:
    """The decompressed payload, piece by piece, each with what it is."""
    out = []

    def add(b: bytes, what: str) -> None:
        out.append(f"{b.hex():<{max(8, min(64, 2 * len(b)))}}  {what}")

    add(struct.pack("<Q", batch.version), f"version u64le = {batch.version}")
    add(bytes.fromhex(batch.manifest_hash), "manifest hash, 32 bytes")
    add(batch.miner, "miner public key, 32 bytes")
    add(bytes([batch.sketch_dim]), f"sketch_dim u8 = {batch.sketch_dim}")
    add(struct.pack("<I", len(batch.groups)), f"n_groups u32le = {len(batch.groups)}")
    for gi, g in enumerate(batch.groups):
        add(struct.pack("<Q", g.index), f"group {gi}: prompt index u64le = {g.index}")
        add(struct.pack("<I", len(g.prompt_ids)), f"  n_prompt u32le = {len(g.prompt_ids)}")
        add(struct.pack("<I", len(g.rollouts)), f"  n_rollouts u32le = {len(g.rollouts)}")
        add(g.prompt_ids.astype("<u4").tobytes(), f"  prompt ids u32le {g.prompt_ids.tolist()}")
        for ri, r in enumerate(g.rollouts):
            n = len(r.completion_ids)
            add(struct.pack("<I", n), f"  rollout {ri}: n u32le = {n}")
            add(struct.pack("<d", r.reward), f"    reward f64le = {r.reward!r}")
            add(r.completion_ids.astype("<u4").tobytes(), f"    ids u32le {r.completion_ids.tolist()}")
            add(r.logprobs.astype("<f4").tobytes(), f"    behaviour logprobs f32le {r.logprobs.tolist()}")
            for t in range(n):
                add(r.sketches[t].tobytes(), f"    sketch of token {t}, {batch.sketch_dim} bytes")
    return out


def prompt_examples() -> list[str]:
    out: list[str] = []
    tok = CharTokenizer()
    add_task = get_task("addition", digits=2)
    for i in (0, 1, 2):
        seed = derive_seed(MANIFEST_HASH, MINER, i)
        la, lb, x, y = task_draws(seed, 4)
        p = add_task.problem(seed)
        out += [
            f"- index {i}: seed `{seed.hex()}`; draws `{la}`, `{lb}`, `{x}`, `{y}`;",
            f"  lengths `1 + {la} % 2` = {1 + la % 2} and `1 + {lb} % 2` = {1 + lb % 2};"
            f" operands {p.meta['a']} and {p.meta['b']}; prompt `{p.prompt}`, answer `{p.answer}`;",
            f"  prompt ids (raw format, the default model's tokenizer) `{tok.encode_prompt(p.prompt)}`",
        ]
    gsm = get_task("gsm8k")
    seed = derive_seed(MANIFEST_HASH, MINER, 0)
    (d0,) = task_draws(seed, 1)
    gp = gsm.problem(seed)
    cd = get_task("countdown")
    cseed = derive_seed(MANIFEST_HASH, MINER, 1)
    draws = task_draws(cseed, 3 * cd.count + 1)
    cp = cd.problem(cseed)
    order = sorted(range(cd.count), key=lambda j: draws[cd.count + j])
    k = 2 + draws[-1] % (cd.count - 1)
    out += [
        "",
        f"`gsm8k` with its packaged sample (`data_sha256` `{gsm.data_sha256}`, {len(gsm.items)} records),",
        f"index 0 (the seed above): draw `{d0}`, record `{d0} % {len(gsm.items)}` = {gp.meta['index']}, prompt",
        "",
        "```",
        *gp.prompt.split("\n"),
        "```",
        "",
        f"answer `{gp.answer}`.",
        "",
        f"`countdown` with its defaults (count 4, max_number 25, max_target 1000, use_all false), index 1"
        f" (seed `{cseed.hex()}`):",
        f"13 draws `{draws}`; numbers {cp.meta['numbers']}; order {order}; `k` = `2 + {draws[-1]} % 3` = {k};"
        f" ops `{[draws[2 * cd.count + s] % 4 for s in range(k - 1)]}`; expression `{cp.answer}`,"
        f" target {cp.meta['target']}; prompt",
        "",
        "```",
        *cp.prompt.split("\n"),
        "```",
    ]
    return out


def fingerprint_examples() -> list[str]:
    d, m = len(HIDDEN[0]), SKETCH_DIM
    key = DOMAIN + bytes.fromhex(MANIFEST_HASH) + d.to_bytes(4, "big") + m.to_bytes(1, "big")
    xof = blake3.blake3(key).digest(length=(m * d + 7) // 8)
    r = projection(MANIFEST_HASH, d, m)
    h = np.array(HIDDEN, dtype=np.float32)
    u = h / np.linalg.norm(h, axis=1, keepdims=True)
    p = u @ r.T
    sk = sketch(h, MANIFEST_HASH)
    out = [
        f"The projection for `d = {d}`, `m = {m}`: key `{key.hex()}` ({len(key)} bytes), BLAKE3 output",
        f"({len(xof)} bytes) `{xof.hex()}`; row 0 is byte 0's bits then byte 1's, most significant first:",
        f"`{''.join('+' if v > 0 else '-' for v in r[0])}`, row 1 `{''.join('+' if v > 0 else '-' for v in r[1])}`.",
        "",
    ]
    for t in range(len(HIDDEN)):
        out += [
            f"Hidden state {t} `{HIDDEN[t]}`: `‖h‖` = {float(np.linalg.norm(h[t])):.9g}; projections `p`",
            f"`{[round(float(v), 6) for v in p[t]]}`;",
            f"`round({SCALE:g}·p)` `{np.rint(p[t] * SCALE).astype(int).tolist()}`; sketch `{sk[t].tobytes().hex()}`.",
            "",
        ]
    big = projection(MANIFEST_HASH, 64, m)
    bits = np.packbits((big.reshape(-1) > 0).astype(np.uint8)).tobytes()
    out += [
        "For the default model (`d = 64`) the matrix is 128 bytes of BLAKE3 output whose SHA-256 is",
        f"`{hashlib.sha256(bits).hexdigest()}`.",
    ]
    return out


def render() -> str:
    """The spec's §12 as Markdown."""
    batch = example_batch()
    leaves = [rollout_leaf(gi, ri, r) for gi, g in enumerate(batch.groups) for ri, r in enumerate(g.rollouts)]
    n01 = hashlib.sha256(b"\x01" + leaves[0] + leaves[1]).digest()
    root = hashlib.sha256(b"\x01" + n01 + leaves[2]).digest()
    assert root.hex() == commitment_root(batch)
    blob = encode_batch(batch)
    payload = b"".join(bytes.fromhex(line.split()[0]) for line in payload_lines(batch))
    r0 = batch.groups[0].rollouts[0]
    leaf_in = (
        b"p2prl-sketch-leaf"
        + struct.pack("<II", 0, 0)
        + r0.completion_ids.astype("<u4").tobytes()
        + r0.sketches.tobytes()
    )
    out = [
        SECTION,
        "",
        "Made by `p2prl/proof/specexamples.py` (`python -m p2prl.proof.specexamples` prints this section; a",
        "test keeps the two equal) with the code a miner and a validator run. Manifest hash `ab…ab` (32",
        "bytes of 0xab), miner key bytes `00 01 … 1f`, version 7, as in §10.",
        "",
        "### Prompt derivation (§11.1)",
        "",
        "`addition` with `digits` 2:",
        "",
        *prompt_examples(),
        "",
        "### Fingerprint sketches (§11.4)",
        "",
        *fingerprint_examples(),
        "",
        "### A batch payload (§11.6)",
        "",
        "Two groups: prompt indices 5 (`48+7=`) and 6 (`62+4=`) of the miner above (`addition`, `digits` 2),",
        "completions `55` (reward 1), `9` and `100`, each followed by the stop token 1; the sketches are of",
        "made-up hidden states. The",
        f"payload before compression ({len(payload)} bytes), piece by piece:",
        "",
        "```",
        *payload_lines(batch),
        "```",
        "",
        f"The blob is `{MAGIC.hex()}` (`P2RB\\x01`) then one zstd frame of these bytes"
        f" (p2prl's level 3 frame makes a {len(blob)}-byte blob;",
        "any valid frame of the same payload is as good: the blob id is the SHA-256 of whatever bytes are sent).",
        "",
        "### Its commitment root (§11.5)",
        "",
        f"Leaf (group 0, rollout 0) is SHA-256 of these {len(leaf_in)} bytes:",
        "",
        "```",
        *wrap(leaf_in.hex()),
        "```",
        "",
        f"- leaf 0 (group 0, rollout 0) `{leaves[0].hex()}`",
        f"- leaf 1 (group 0, rollout 1) `{leaves[1].hex()}`",
        f"- leaf 2 (group 1, rollout 0) `{leaves[2].hex()}`",
        f"- level 1: SHA-256(`01` ‖ leaf 0 ‖ leaf 1) `{n01.hex()}`, leaf 2 promoted unchanged",
        f"- root: SHA-256(`01` ‖ level-1 node ‖ leaf 2) = `commitment_root` `{root.hex()}`",
        "",
        "### The sampling check's miss threshold (§10)",
        "",
        "The fewest misses `M` that fail a batch of `N` checked tokens, `P(Binomial(N, 1e-4) ≥ M) < 1e-9`:",
        "",
        "| N | M |",
        "|---|---|",
        *[f"| {lo}–{hi} | {m} |" for lo, hi, m in miss_thresholds(20000)],
    ]
    return "\n".join(out) + "\n"


def miss_thresholds(n_max: int, rate: float = 1e-4, alpha: float = 1e-9) -> list[tuple[int, int, int]]:
    """``(N from, N to, M)``: the rows of the table above, from the validator's own bound."""
    from p2prl.proof.validate import binom_log_sf

    rows: list[tuple[int, int, int]] = []
    m = 1
    for n in range(2, n_max + 1):
        while binom_log_sf(m, n, rate) >= math.log(alpha):
            m += 1
        if rows and rows[-1][2] == m:
            rows[-1] = (rows[-1][0], n, m)
        else:
            rows.append((n, n, m))
    return rows


if __name__ == "__main__":
    print(render(), end="")
