"""The demo's held-out evaluation: the base model against the version a miner saved, in the genesis's
settings, on the fixed set (nothing here depends on how far a loaded machine's run got)."""

from pathlib import Path

from typer.testing import CliRunner

from p2prl.cli.main import app
from p2prl.demo.heldout import held_out
from p2prl.node.weights.disk import save_weights
from p2prl.node.weights.version import Weights
from p2prl.rl import build_default_model, load_model, unique_state, weights_hash


def test_held_out_compares_the_base_model_with_the_saved_version(tmp_path: Path, model_cache: Path) -> None:
    genesis = tmp_path / "genesis.json"
    r = CliRunner().invoke(
        app,
        ["network", "init", "--out", str(genesis), "--key", str(tmp_path / "k"), "--validator", "ab" * 32,
         "--model-cache", str(model_cache)],
    )
    assert r.exit_code == 0, r.output
    weights = tmp_path / "miner" / "weights"
    none = held_out(genesis, None, model_cache, weights, 64)
    assert none["last"] is None and none["version"] is None
    # the built-in model's warm start answers about a third of the fixed set (docs/RL.md)
    assert 0.1 < none["first"] < 0.6
    model, _ = load_model(build_default_model(model_cache))
    state = {k: v.clone() for k, v in unique_state(model).items()}
    state["model.embed_tokens.weight"].zero_()  # every logit 0: greedy answers nothing right
    save_weights(Weights(7, weights_hash(state), state), weights)
    h = held_out(genesis, None, model_cache, weights, 64)
    assert (h["problems"], h["version"], h["first"]) == (64, 7, none["first"])
    assert h["last"] == 0.0 and h["reward_last"] == 0.0
