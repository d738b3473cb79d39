"""An independent p2prl miner, written from docs/PROTOCOL.md alone: it imports nothing from p2prl.

It reads a genesis's generation settings and task, loads the model directory with ``transformers``
like any client, and makes what a miner publishes: the batch blob (§11.6) with its prompts (§11.1,
§11.2), completions drawn by verifiable sampling (§10, §11.3), behaviour logprobs (§10), fingerprint
sketches (§11.4), and the signed ``rollout_announcement`` envelope (§1, §2, §3) naming the blob and its
commitment root (§11.5). It reads the trainer's ``receipts`` (§14) and follows a receipt of one of its
batches with a chained batch, the only kind a trainer trains. ``Deviation`` names the ways a dishonest
miner departs from the spec, each of which a validator must reject with the reason the spec gives.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import blake3
import nacl.signing
import numpy as np
import torch
import zstandard
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

MAGIC = b"P2RB\x01"
SKETCH_DIM = 16
ENVELOPE_MAGIC = b"P2E\x01"


class Deviation(enum.Enum):
    """What the miner does wrong on purpose (NONE: follows the spec)."""

    NONE = "none"
    FINGERPRINT_POSITION = "fingerprint_position"  # sketches of the state after the token's (§11.4)
    REDRAWN = "redrawn"  # every sample drawn with another sample's uniforms (§10: re-drawing a batch)
    SHARPENED = "sharpened"  # sampling at half the genesis temperature (§10's example)


# ---- §14: receipt chains --------------------------------------------------------------------------------
def receipt_id(signer: bytes, blob_id: str) -> str:
    return hashlib.sha256(b"p2prl/receipt\x00" + signer + bytes.fromhex(blob_id)).digest()[:16].hex()


def chain_seed(receipts_digest: str, prev: str) -> str:
    return hashlib.sha256(b"p2prl/chain\x00" + bytes.fromhex(receipts_digest) + bytes.fromhex(prev)).hexdigest()


def open_envelope(raw: bytes, network: str) -> tuple[str, bytes, dict]:
    """§2: (type, signer key, body) of a signed envelope whose signature verifies (else ValueError)."""
    if raw[:4] != ENVELOPE_MAGIC:
        raise ValueError("not an envelope")
    tl = raw[4]
    typ, at = raw[5 : 5 + tl], 5 + tl
    signer = raw[at : at + 32]
    (n,) = struct.unpack(">I", raw[at + 32 : at + 36])
    body, sig = raw[at + 36 : at + 36 + n], raw[at + 36 + n :]
    if len(sig) != 64:
        raise ValueError("bad envelope length")
    net = network.encode()
    signed = b"p2prl/envelope/v1\x00" + bytes([len(net)]) + net + bytes([tl]) + typ + body
    nacl.signing.VerifyKey(signer).verify(signed, sig)  # raises on a bad signature
    return typ.decode(), signer, json.loads(body)


# ---- §1, §2: canonical JSON and the signed envelope ---------------------------------------------------
def canonical(value: object) -> bytes:
    """§1 for the values an announcement holds (objects, lists, ASCII strings, integers)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def seal(key: nacl.signing.SigningKey, network: str, typ: str, body: dict) -> bytes:
    b, t, n = canonical(body), typ.encode(), network.encode()
    signed = b"p2prl/envelope/v1\x00" + bytes([len(n)]) + n + bytes([len(t)]) + t + b
    sig = key.sign(signed).signature
    return ENVELOPE_MAGIC + bytes([len(t)]) + t + bytes(key.verify_key) + struct.pack(">I", len(b)) + b + sig


def blob_ref(blob: bytes, chunk_size: int) -> dict:
    """§3 BlobRef (the chunk size raised so there are at most 2048 chunks)."""
    size = len(blob)
    if size > 2048 * chunk_size:
        chunk_size = min(16 << 20, -(-size // 2048))
    n = max(1, -(-size // chunk_size))
    chunks = [hashlib.sha256(blob[i * chunk_size : (i + 1) * chunk_size]).hexdigest() for i in range(n)]
    return {"id": hashlib.sha256(blob).hexdigest(), "size": size, "chunk_size": chunk_size, "chunks": chunks}


# ---- §11.1: prompt derivation -----------------------------------------------------------------------
def prompt_seed(manifest_hash: str, miner: bytes, index: int) -> bytes:
    return hashlib.sha256(bytes.fromhex(manifest_hash) + miner + index.to_bytes(8, "big")).digest()


def draw(seed: bytes, k: int) -> int:
    return int.from_bytes(hashlib.sha256(b"p2prl-task" + seed + k.to_bytes(4, "big")).digest()[:8], "big")


def addition_problem(seed: bytes, digits: int) -> tuple[str, str]:
    la, lb, x, y = (draw(seed, k) for k in range(4))

    def operand(length: int, value: int) -> int:
        n = 1 + length % digits
        lo = 0 if n == 1 else 10 ** (n - 1)
        return lo + value % (10**n - lo)

    a, b = operand(la, x), operand(lb, y)
    return f"{a}+{b}=", str(a + b)


def gsm8k_prompt(seed: bytes, records: list[dict]) -> str:
    return "Question: " + records[draw(seed, 0) % len(records)]["question"] + "\nAnswer:"


def countdown_problem(
    seed: bytes, count: int = 4, max_number: int = 25, max_target: int = 1000, use_all: bool = False
) -> tuple[str, str]:
    d = [draw(seed, k) for k in range(3 * count + 1)]
    numbers = [1 + d[j] % max_number for j in range(count)]
    order = sorted(range(count), key=lambda j: d[count + j])
    k = count if use_all else 2 + d[3 * count] % (count - 1)
    value, expr = Fraction(numbers[order[0]]), str(numbers[order[0]])
    for step in range(k - 1):
        n, op = numbers[order[step + 1]], d[2 * count + step] % 4
        if op == 3 and value % n == 0:
            value, expr = value / n, f"({expr})/{n}"
        elif op == 2 and value * n <= max_target:
            value, expr = value * n, f"({expr})*{n}"
        elif op == 1 and value - n >= 1:
            value, expr = value - n, f"{expr}-{n}"
        else:
            value, expr = value + n, f"{expr}+{n}"
    rule = "exactly once" if use_all else "at most once"
    prompt = (
        f"Numbers: {' '.join(map(str, numbers))}. Target: {int(value)}. Combine the numbers with + - * / and "
        f"parentheses, using each number {rule}, to make the target. Answer with the expression.\nAnswer:"
    )
    return prompt, expr


# ---- §10: verifiable sampling ------------------------------------------------------------------------
def sample_key(manifest_hash: str, miner: bytes, i: int, j: int) -> bytes:
    return hashlib.sha256(
        b"p2prl/sample/v1"
        + bytes.fromhex(manifest_hash)
        + miner
        + i.to_bytes(8, "big")
        + j.to_bytes(4, "big")
    ).digest()


def uniform(key: bytes, t: int) -> float:
    word = int.from_bytes(hashlib.sha256(key + t.to_bytes(4, "big")).digest()[:8], "big")
    return (word >> 11) / 2.0**53


def top_p_drop(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """§10 steps 1–3 (float64): the tokens top-p drops."""
    x = logits.double() / (temperature if temperature > 0 else 1.0)
    e = torch.exp(x - x.max())
    p = e * (1.0 / e.sum())
    order = torch.sort(-p, stable=True).indices
    sp = p[order]
    drop = torch.zeros_like(p, dtype=torch.bool)
    drop[order] = (torch.cumsum(sp, 0) - sp) >= top_p
    return drop


def pick(logits: torch.Tensor, u: float, temperature: float, top_p: float) -> int:
    """§10 steps 1–4 on one position's logits (float64)."""
    z = logits.double()
    if temperature == 0:
        return int(torch.argmax(logits.float()))
    x = z / temperature
    e = torch.exp(x - x.max())
    p = e * (1.0 / e.sum())
    if top_p < 1:
        p = p.masked_fill(top_p_drop(logits, temperature, top_p), 0.0)
        p = p / p.sum()
    c = torch.cumsum(p, 0)
    tok = int(torch.searchsorted(c, torch.tensor([u * float(c[-1])], dtype=torch.float64), right=True)[0])
    last = int(torch.nonzero(p > 0)[-1])
    return min(tok, last)


def behaviour_logprob(logits: torch.Tensor, tok: int, temperature: float, top_p: float) -> float:
    """§10 "Behaviour logprobs": float32, renormalised over the tokens step 3 keeps."""
    lg = logits.float() / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(lg, -1)
    if top_p < 1:
        lp = torch.log_softmax(lp.masked_fill(top_p_drop(logits, temperature, top_p), float("-inf")), -1)
    return float(lp[tok])


# ---- §11.4: the fingerprint --------------------------------------------------------------------------
def projection(manifest_hash: str, d: int, m: int = SKETCH_DIM) -> np.ndarray:
    key = b"p2prl-fingerprint-v1" + bytes.fromhex(manifest_hash) + d.to_bytes(4, "big") + bytes([m])
    raw = np.frombuffer(blake3.blake3(key).digest(length=(m * d + 7) // 8), dtype=np.uint8)
    bits = np.unpackbits(raw)[: m * d]  # most significant bit first
    return (bits.astype(np.float32) * 2 - 1).reshape(m, d)


def sketch(hidden: np.ndarray, manifest_hash: str) -> np.ndarray:
    h = hidden.astype(np.float32)
    u = h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)
    p = u @ projection(manifest_hash, h.shape[1]).T
    return (np.rint(p * 512).astype(np.int64) & 0xFF).astype(np.uint8)


# ---- §11.5 and §11.6: commitment root and blob -------------------------------------------------------
def merkle_root(leaves: list[bytes]) -> bytes:
    if not leaves:
        return hashlib.sha256(b"p2prl-empty").digest()
    level = leaves
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[k] + level[k + 1]).digest() for k in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


@dataclass
class Rollout:
    ids: list[int]
    logprobs: list[float]
    reward: float
    sketches: np.ndarray  # uint8 [n, 16]


@dataclass
class Group:
    index: int
    prompt_ids: list[int]
    rollouts: list[Rollout]


def payload(version: int, manifest_hash: str, miner: bytes, groups: list[Group]) -> bytes:
    out = [struct.pack("<Q", version), bytes.fromhex(manifest_hash), miner, bytes([SKETCH_DIM])]
    out.append(struct.pack("<I", len(groups)))
    for g in groups:
        out.append(struct.pack("<QII", g.index, len(g.prompt_ids), len(g.rollouts)))
        out.append(struct.pack(f"<{len(g.prompt_ids)}I", *g.prompt_ids))
        for r in g.rollouts:
            n = len(r.ids)
            out += [struct.pack("<Id", n, r.reward), struct.pack(f"<{n}I", *r.ids)]
            out += [struct.pack(f"<{n}f", *r.logprobs), r.sketches.astype(np.uint8).tobytes()]
    return b"".join(out)


def commitment(groups: list[Group]) -> str:
    leaves = []
    for gi, g in enumerate(groups):
        for ri, r in enumerate(g.rollouts):
            data = struct.pack("<II", gi, ri) + struct.pack(f"<{len(r.ids)}I", *r.ids) + r.sketches.tobytes()
            leaves.append(hashlib.sha256(b"p2prl-sketch-leaf" + data).digest())
    return merkle_root(leaves).hex()


# ---- the miner ---------------------------------------------------------------------------------------
class IndieMiner:
    """Mines ``addition`` (or ``digit-start``) batches for a genesis whose prompt format is ``raw``."""

    def __init__(self, model_dir: Path, genesis: dict, seed: bytes, deviation: Deviation = Deviation.NONE):
        self.key = nacl.signing.SigningKey(seed)
        self.miner = bytes(self.key.verify_key)
        self.genesis = genesis
        gen = genesis["generation"]
        self.temperature = gen["temperature_milli"] / 1000
        self.top_p = gen["top_p_milli"] / 1000
        self.max_new = gen["max_new_tokens"]
        self.group_size = gen["group_size"]
        self.stops = set(gen["stop_token_ids"])
        task = genesis["task"]
        if task["name"] not in ("addition", "digit-start") or genesis["prompt"]["format"] != "raw":
            raise ValueError("this miner knows the addition prompt in raw format only")
        self.task_name, self.digits = task["name"], task["params"].get("digits", 2)
        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
        self.deviation = deviation
        self.next_index: dict[int, int] = {}  # version -> next prompt index of its chain starts
        self.waiting: dict[str, str] = {}  # receipt id -> blob id of its batches not yet receipted
        self.slots: list[tuple[str, str]] = []  # (previous blob id, receipts digest), oldest first

    def on_receipts(self, raw: bytes, trainer: bytes, network: str) -> int:
        """A ``receipts`` envelope (§14): its own batches listed become slots; how many did."""
        typ, signer, body = open_envelope(raw, network)
        if typ != "receipts" or signer != trainer:
            return 0
        digest = hashlib.sha256(raw).hexdigest()
        found = [self.waiting.pop(e) for e in body["entries"] if e in self.waiting]
        self.slots += [(b, digest) for b in found]
        return len(found)

    def reward(self, answer: str, text: str) -> float:
        if self.task_name == "digit-start":
            return 1.0 if text[:1].isdigit() and text[:1].isascii() else 0.0
        return 1.0 if text == answer else 0.0

    @torch.no_grad()
    def complete_group(
        self, prompt_ids: list[int], manifest_hash: str, i: int
    ) -> list[tuple[list[int], list[float], np.ndarray]]:
        """The group's completions (§11.3), its samples side by side in one batch (they share the prompt,
        so no padding): per sample its token ids, behaviour logprobs and final-norm hidden states."""
        g = self.group_size
        shift = g if self.deviation is Deviation.REDRAWN else 0  # another sample's uniforms: re-drawn
        keys = [sample_key(manifest_hash, self.miner, i, j + shift) for j in range(g)]
        temperature = self.temperature / 2 if self.deviation is Deviation.SHARPENED else self.temperature
        base, head = self.model.model, self.model.lm_head
        out = base(input_ids=torch.tensor([prompt_ids] * g), use_cache=True)
        ids: list[list[int]] = [[] for _ in range(g)]
        lps: list[list[float]] = [[] for _ in range(g)]
        hidden: list[list[np.ndarray]] = [[] for _ in range(g)]
        done = [False] * g
        for t in range(self.max_new):
            h = out.last_hidden_state[:, -1]
            logits = head(h)
            nxt = []
            for r in range(g):
                if done[r]:
                    nxt.append(0)
                    continue
                tok = pick(logits[r], uniform(keys[r], t), temperature, self.top_p)
                ids[r].append(tok)
                lps[r].append(behaviour_logprob(logits[r], tok, self.temperature, self.top_p))
                hidden[r].append(h[r].float().numpy())
                done[r] = tok in self.stops
                nxt.append(tok)
            if all(done):
                break
            out = base(
                input_ids=torch.tensor(nxt)[:, None], past_key_values=out.past_key_values, use_cache=True
            )
        res = []
        for r in range(g):
            hid = np.stack(hidden[r])
            if self.deviation is Deviation.FINGERPRINT_POSITION:
                # the state that read each token, not the one that produced it
                full = (
                    base(input_ids=torch.tensor([prompt_ids + ids[r]])).last_hidden_state[0].float().numpy()
                )
                hid = full[len(prompt_ids) : len(prompt_ids) + len(ids[r])]
            res.append((ids[r], lps[r], hid))
        return res

    def mine(self, version: int, manifest_hash: str, n_groups: int, network: str) -> tuple[bytes, bytes]:
        """The next batch of ``n_groups`` prompts at ``version``: (blob, signed announcement envelope).
        It follows the oldest receipt in hand (a chained batch, §14), else it is a chain start."""
        body: dict = {}
        if self.slots:
            prev, digest = self.slots.pop(0)
            seed, start = chain_seed(digest, prev), 0  # it stands for the manifest hash in §11.1, §11.3
            body = {"prev": prev, "receipts": digest}
        else:
            seed, start = manifest_hash, self.next_index.get(version, 0)
            self.next_index[version] = start + n_groups
        groups = []
        for i in range(start, start + n_groups):
            prompt, answer = addition_problem(prompt_seed(seed, self.miner, i), self.digits)
            prompt_ids = self.tok.encode(prompt, add_special_tokens=False).ids
            rollouts = []
            for ids, lps, hid in self.complete_group(prompt_ids, seed, i):
                text = self.tok.decode(ids, skip_special_tokens=True)
                rollouts.append(Rollout(ids, lps, self.reward(answer, text), sketch(hid, manifest_hash)))
            groups.append(Group(i, prompt_ids, rollouts))
        blob = MAGIC + zstandard.ZstdCompressor(level=3).compress(
            payload(version, manifest_hash, self.miner, groups)
        )
        ref = blob_ref(blob, self.genesis["patch"]["chunk_size"])
        body |= {
            "version": version,
            "manifest_hash": manifest_hash,
            "blob": ref,
            "groups": n_groups,
            "commitment_root": commitment(groups),
            "created_ms": 0,
        }
        self.waiting[receipt_id(self.miner, ref["id"])] = ref["id"]
        return blob, seal(self.key, network, "rollout_announcement", body)


def check_spec_examples(spec: str) -> int:
    """Recompute the worked examples of docs/PROTOCOL.md §10 and §12 that this miner's functions make;
    returns how many agreed (raises on the first that does not)."""
    mh, miner = "ab" * 32, bytes(range(32))
    n = 0
    key = sample_key(mh, miner, 5, 3)
    assert f"key = `{key.hex()}`" in spec
    n += 1
    assert f"`{uniform(key, 0)!r}`" in spec
    n += 1
    for i in range(3):
        seed = prompt_seed(mh, miner, i)
        prompt, answer = addition_problem(seed, 2)
        assert f"index {i}: seed `{seed.hex()}`" in spec and f"prompt `{prompt}`, answer `{answer}`" in spec
        n += 1
    seed = prompt_seed(mh, miner, 1)
    prompt, expr = countdown_problem(seed)
    assert f"expression `{expr}`" in spec and prompt.split("\n")[0] in spec
    n += 1
    proj = projection(mh, 8)
    row0 = "".join("+" if v > 0 else "-" for v in proj[0])
    assert f"`{row0}`, row 1" in spec
    n += 1
    for hidden in (
        [0.5, -1.25, 2.0, 0.0, -0.375, 1.5, -3.0, 0.8125],
        [1.0, 1.0, -1.0, 0.25, 0.0, -0.5, 2.5, -2.0],
    ):
        sk = sketch(np.array([hidden], dtype=np.float32), mh)[0]
        assert f"sketch `{sk.tobytes().hex()}`" in spec
        n += 1
    z = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=torch.bfloat16)
    assert pick(z, uniform(key, 0), 1.0, 1.0) == 2 and pick(z, uniform(key, 1), 1.0, 1.0) == 1
    assert pick(z, uniform(key, 1), 0.5, 1.0) == 2
    n += 1
    x = z.double()
    e = torch.exp(x - x.max())
    assert f"`{float(e[0] * (1.0 / e.sum()))!r}`" in spec or repr(float(e[0] * (1.0 / e.sum()))) in spec
    n += 1
    assert math.isclose(sum(float(v) for v in e * (1.0 / e.sum())), 1.0)
    return n
