import torch

from p2prl.rl.engine import GenerationParams, HFEngine
from p2prl.rl.grpo import GRPOConfig, GRPOTrainer, group_advantages
from p2prl.rl.model import load_model
from p2prl.rl.types import Rollout, RolloutGroup


def test_group_advantages_math() -> None:
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(a, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # mean 0.25, population std sqrt(0.1875)
    s = 0.1875**0.5
    assert torch.allclose(a, torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]), atol=1e-5)
    assert abs(float(a.sum())) < 1e-5
    assert torch.equal(group_advantages(torch.ones(8)), torch.zeros(8))
    assert torch.equal(group_advantages(torch.tensor([1.0])), torch.zeros(1))


def _groups(model_dir, version: int = 0) -> tuple[list[RolloutGroup], object]:
    policy, tok = load_model(model_dir, torch.float32)
    eng = HFEngine(policy, tok, return_hidden=False)
    prompts = [tok.encode(p) for p in ("1+2=", "13+8=", "40+41=")]
    out = eng.generate(prompts, 4, GenerationParams(4, seed=3))
    groups = []
    for p, g in zip(prompts, out, strict=True):
        rolls = [Rollout(s.completion_ids, s.logprobs, float(i % 2)) for i, s in enumerate(g)]
        groups.append(RolloutGroup(p, rolls, version=version))
    return groups, tok


def test_step_on_policy_ratio_is_one_and_state_round_trips(default_model_dir, tmp_path) -> None:
    groups, tok = _groups(default_model_dir)
    master, _ = load_model(default_model_dir, torch.float32)
    tr = GRPOTrainer(master, GRPOConfig(lr=1e-3, kl_coef=0.1), pad_id=tok.pad_id)
    before = tr.published_state()
    assert all(v.dtype == torch.bfloat16 for v in before.values())
    assert "lm_head.weight" not in before  # tied to the embedding: published once
    st = tr.step(groups)
    assert st["skipped"] == 0.0 and tr.version == 1
    assert abs(st["ratio_mean"] - 1.0) < 1e-4 and st["clip_frac"] == 0.0 and st["kl"] < 1e-6
    assert st["grad_norm"] > 0
    after = tr.published_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # all-equal rewards carry no signal: no step
    flat = [
        RolloutGroup(g.prompt_ids, [Rollout(r.completion_ids, r.logprobs, 1.0) for r in g.rollouts], 0)
        for g in groups
    ]
    assert tr.step(flat)["skipped"] == 1.0 and tr.version == 1
    # save / restore master weights + optimizer
    tr.save(tmp_path / "t.pt")
    m2, _ = load_model(default_model_dir, torch.float32)
    tr2 = GRPOTrainer(m2, GRPOConfig(lr=1e-3, kl_coef=0.1))
    tr2.load(tmp_path / "t.pt")
    assert tr2.version == 1
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, tr2.model.state_dict()[k])
    s1, s2 = tr.step(groups), tr2.step(groups)
    assert s1["loss"] == s2["loss"]
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, tr2.model.state_dict()[k])
    # load_published sets the master weights from bf16
    tr2.load_published(before)
    assert all(torch.equal(tr2.published_state()[k], before[k]) for k in before)


def test_stale_logprobs_get_clipped(default_model_dir) -> None:
    groups, tok = _groups(default_model_dir)
    for g in groups:
        for r in g.rollouts:
            r.logprobs = [lp - 1.0 for lp in r.logprobs]  # behaviour policy much less likely: ratio e
    master, _ = load_model(default_model_dir, torch.float32)
    st = GRPOTrainer(master, GRPOConfig(lr=1e-4), pad_id=tok.pad_id).step(groups)
    assert st["clip_frac"] == 1.0 and st["ratio_mean"] > 2.0


def test_one_forged_rollout_cannot_steer_the_step(default_model_dir) -> None:
    """Attack: one rollout with a negative advantage reports behaviour logprobs 19 nats below the
    truth. Without dual clipping its ratio e^19 multiplies its gradient and the step becomes its update."""
    groups, tok = _groups(default_model_dir)
    forged = [
        RolloutGroup(
            g.prompt_ids, [Rollout(r.completion_ids, list(r.logprobs), r.reward) for r in g.rollouts], 0
        )
        for g in groups
    ]
    liar = next(r for r in forged[0].rollouts if r.reward == 0.0)  # negative advantage
    liar.logprobs = [lp - 19.0 for lp in liar.logprobs]
    norms = {}
    for name, gs in (("honest", groups), ("forged", forged)):
        master, _ = load_model(default_model_dir, torch.float32)
        tr = GRPOTrainer(master, GRPOConfig(lr=1e-3), pad_id=tok.pad_id)
        before = {k: v.clone() for k, v in tr.model.state_dict().items()}
        st = tr.step(gs)
        norms[name] = st["grad_norm"]
        norms[name + "_delta"] = torch.cat([(tr.model.state_dict()[k] - before[k]).flatten() for k in before])
    # the forged rollout's tokens carry no more weight than an honest one's: the gradient stays the
    # honest step's size and the update keeps the honest step's direction
    assert norms["forged"] < 2 * norms["honest"], norms
    cos = torch.nn.functional.cosine_similarity(norms["honest_delta"], norms["forged_delta"], dim=0)
    assert float(cos) > 0.5
    assert st["logprob_gap_frac"] > 0  # the lie's tokens lie beyond the trainer's trust bound


def test_a_large_vocabulary_splits_the_micro_batch_into_the_same_update(default_model_dir, monkeypatch) -> None:
    """Logits bound the micro-batch (a 49k vocabulary at 512 rows did not fit 24 GiB); the update
    is the same sum over rows either way."""
    import math

    import p2prl.rl.grpo as grpo

    groups, tok = _groups(default_model_dir)
    states = []
    for budget in (grpo.LOGIT_ELEMS, 1):  # 1: every micro-batch one row
        monkeypatch.setattr(grpo, "LOGIT_ELEMS", budget)
        torch.manual_seed(0)
        master, _ = load_model(default_model_dir, torch.float32)
        tr = GRPOTrainer(master, GRPOConfig(lr=1e-3), pad_id=tok.pad_id)
        rows = [grpo.Row([1, 2], [3], [0.0], 1.0, 0, 0, None, 0.0)]
        want = tr.config.micro_batch if budget > 1 else 1
        assert tr._rows_per_micro_batch(rows * 4) == want
        states.append(tr.step(groups))
    # the loss and the gradient's norm are sums over rows: equal up to float summation order (Adam's
    # update of a near-zero gradient element is not, so the weights after the step are not compared)
    for k in ("loss", "grad_norm", "tokens", "rollouts_used"):
        assert math.isclose(states[0][k], states[1][k], rel_tol=1e-4, abs_tol=1e-7), k
