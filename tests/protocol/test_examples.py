from pathlib import Path

from p2prl.crypto.canonical import canonical_bytes
from p2prl.protocol.examples import (
    BUILTIN_MODEL,
    MINER,
    MINER_PEER_ID,
    NETWORK,
    SECTION,
    TRAINER,
    TRAINER_PEER_ID,
    examples,
    render,
)
from p2prl.protocol.messages import MESSAGE_TYPES, decode_message

SPEC = Path(__file__).parents[2] / "docs" / "PROTOCOL.md"


def test_every_message_type_has_an_example_that_verifies():
    seen = set()
    for ex in examples():
        env, msg = decode_message(ex.raw, NETWORK)
        assert msg == ex.message and env.type == msg.TYPE
        assert env.body_bytes == canonical_bytes(msg.to_body())
        seen.add(env.type)
    assert seen == set(MESSAGE_TYPES)


def test_the_spec_prints_exactly_these_examples():
    """docs/PROTOCOL.md §8 is what the module renders (regenerate: python -m p2prl.protocol.examples)."""
    text = SPEC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)].rstrip("\n")
    assert section == render().rstrip("\n")


def _transformers_is_pinned() -> bool:
    """The transformers release constraints.txt pins (the one the example's files were written by)."""
    import transformers

    pins = (Path(__file__).parents[2] / "constraints.txt").read_text().splitlines()
    return f"transformers=={transformers.__version__}" in pins


def test_the_genesis_example_is_one_a_node_runs(model_cache):
    """Its model is the built-in one (it named a v2 of 138,000 parameters that no build makes) and its
    bootstrap peer id is the trainer key's (a placeholder id was refused by every node)."""
    from p2prl.net.identity import peer_id_for
    from p2prl.node.setup.netinit import base_model_info

    built = base_model_info(model_cache)
    # the weights ship with the package: the same bits, so the same hash, on every CPU; config.json
    # and the tokenizer's files are written by transformers, so their hashes are the pinned release's
    assert (built.name, built.weights_hash, built.parameters) == (
        BUILTIN_MODEL.name,
        BUILTIN_MODEL.weights_hash,
        BUILTIN_MODEL.parameters,
    )
    if _transformers_is_pinned():
        assert built == BUILTIN_MODEL
    assert peer_id_for(TRAINER) == TRAINER_PEER_ID and peer_id_for(MINER) == MINER_PEER_ID
    genesis = next(ex.message for ex in examples() if ex.message.TYPE == "genesis")
    assert genesis.model == BUILTIN_MODEL
    assert genesis.bootstrap == (f"/ip4/192.0.2.1/tcp/4001/p2p/{TRAINER_PEER_ID}",)
    import multiaddr
    from libp2p.peer.peerinfo import info_from_p2p_addr  # what a node parses a bootstrap address with

    assert info_from_p2p_addr(multiaddr.Multiaddr(genesis.bootstrap[0])).peer_id.to_base58() == TRAINER_PEER_ID
