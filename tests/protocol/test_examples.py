from pathlib import Path

from p2prl.crypto.canonical import canonical_bytes
from p2prl.protocol.examples import NETWORK, SECTION, examples, render
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
