import pytest
import torch

from p2prl.rl.engine import GenerationParams, HFEngine, processed_logprobs, teacher_forced
from p2prl.rl.model import build_default_model, load_model, model_meta, unique_state, weights_hash


def test_default_model_is_cached_and_hashed(default_model_dir, model_cache) -> None:
    assert build_default_model(model_cache) == default_model_dir
    meta = model_meta(default_model_dir)
    assert 0.0 < meta["warm_start"]["greedy_success"] < 0.9
    assert (default_model_dir / "config.json").exists() and (default_model_dir / "model.safetensors").exists()
    model, tok = load_model(default_model_dir)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert weights_hash(unique_state(model)) == meta["weights_hash"]
    from p2prl.patch.hashing import weights_hash_file

    assert weights_hash_file(default_model_dir / "model.safetensors") == meta["weights_hash"]
    assert tok.decode(tok.encode("12+34=")) == "12+34="


def test_processed_logprobs_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = processed_logprobs(logits, 1.0, 0.75)
    assert torch.allclose(lp.exp(), torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    lp = processed_logprobs(logits, 0.5, 1.0)
    p = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert torch.allclose(lp.exp(), p / p.sum(), atol=1e-6)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_engine_shapes_and_teacher_forced_match(default_model_dir, top_p: float) -> None:
    model, tok = load_model(default_model_dir, torch.float32)
    eng = HFEngine(model, tok)
    prompts = [tok.encode(p) for p in ("7+5=", "12+34=", "99+1=")]
    params = GenerationParams(max_new_tokens=5, temperature=0.9, top_p=top_p, seed=11)
    out = eng.generate(prompts, 4, params)
    assert [len(g) for g in out] == [4, 4, 4]
    d = model.config.hidden_size
    for prompt, group in zip(prompts, out, strict=True):
        for s in group:
            n = len(s.completion_ids)
            assert s.prompt_ids == prompt and 1 <= n <= 5
            assert tok.eos_id not in s.completion_ids[:-1]
            assert len(s.logprobs) == n and all(lp <= 0 for lp in s.logprobs)
            assert s.hidden is not None and s.hidden.shape == (n, d) and s.hidden.dtype == torch.float32
            lp, hid = teacher_forced(model, s.prompt_ids, s.completion_ids, 0.9, top_p)
            assert torch.allclose(lp, torch.tensor(s.logprobs), atol=1e-4)
            assert torch.allclose(hid, s.hidden, atol=1e-4)
    again = eng.generate(prompts, 4, params)
    assert [[s.completion_ids for s in g] for g in again] == [[s.completion_ids for s in g] for g in out]


def test_engine_bf16_close_and_in_place_update(default_model_dir) -> None:
    model, tok = load_model(default_model_dir, torch.bfloat16)
    eng = HFEngine(model, tok)
    out = eng.generate([tok.encode("3+4=")], 2, GenerationParams(4, seed=1))
    s = out[0][0]
    lp, hid = teacher_forced(model, s.prompt_ids, s.completion_ids)
    assert torch.allclose(lp, torch.tensor(s.logprobs), atol=0.05)
    assert torch.allclose(hid, s.hidden, atol=0.1)
    ptr = model.model.embed_tokens.weight.data_ptr()
    state = {k: torch.zeros_like(v) for k, v in unique_state(model).items()}
    eng.load_state_dict(state)
    assert model.model.embed_tokens.weight.data_ptr() == ptr
    assert float(model.lm_head.weight.detach().abs().sum()) == 0.0  # tied alias updated too
    with pytest.raises(KeyError):
        eng.load_state_dict({"nope": torch.zeros(1)})
    with pytest.raises(KeyError):
        eng.load_state_dict({"model.norm.weight": state["model.norm.weight"]})


def test_greedy_and_bad_params(default_model_dir) -> None:
    model, tok = load_model(default_model_dir, torch.float32)
    eng = HFEngine(model, tok, return_hidden=False)
    a = eng.generate([tok.encode("1+1=")], 3, GenerationParams(4, temperature=0.0, seed=1))
    b = eng.generate([tok.encode("1+1=")], 1, GenerationParams(4, temperature=0.0, seed=2))
    assert all(s.completion_ids == b[0][0].completion_ids and s.hidden is None for s in a[0])
    with pytest.raises(ValueError):
        GenerationParams(0)
    with pytest.raises(ValueError):
        GenerationParams(4, top_p=0.0)
    with pytest.raises(ValueError):
        eng.generate([[]], 1, GenerationParams(4))


def test_scatter_into_writes_only_the_given_elements_as_bits() -> None:
    """The switch's writes on the engine's device (here the CPU, same code as CUDA): sparse positions
    from an offset, a dense run, and values of another dtype converted; nothing else moves."""
    from p2prl.rl.engine import scatter_into

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)).to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    nan = torch.tensor([-1], dtype=torch.int16).view(torch.bfloat16)  # a NaN payload: bits, not values
    vals = torch.cat([nan, torch.tensor([2.5], dtype=torch.bfloat16)])
    dense = torch.arange(5, dtype=torch.float32)
    n = scatter_into(
        model, [("0.weight", 10, torch.tensor([0, 7]), vals), ("1.weight", 3, None, dense.to(torch.bfloat16))]
    )
    assert n == 2 * 2 + 5 * 2
    w0 = model.state_dict()["0.weight"].view(-1)
    assert w0.view(torch.int16)[10] == -1 and w0[17] == 2.5
    mask = torch.ones(64, dtype=torch.bool)
    mask[[10, 17]] = False
    assert torch.equal(w0.view(torch.int16)[mask], before["0.weight"].view(-1).view(torch.int16)[mask])
    assert torch.equal(model.state_dict()["1.weight"].view(-1)[3:8], dense.to(torch.bfloat16))
    model32 = torch.nn.Linear(8, 4)
    scatter_into(model32, [("weight", 0, torch.tensor([1]), torch.tensor([0.5], dtype=torch.bfloat16))])
    assert model32.weight.view(-1)[1].item() == 0.5
