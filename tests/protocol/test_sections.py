"""Typed genesis sections: a body is parsed once, strictly; anything off the declaration is refused."""

import pytest

from p2prl.protocol.fields import MessageError
from p2prl.protocol.sections import (
    GenerationSpec,
    ModelSpec,
    PromptSpec,
    TaskSpec,
    parse_section,
    section_body,
)

H = "ab" * 32


def test_roundtrip_and_strictness() -> None:
    g = GenerationSpec(max_new_tokens=16, stop_token_ids=(5, 7))
    body = section_body(g)
    assert body["stop_token_ids"] == [5, 7]
    assert parse_section(GenerationSpec, body, "generation") == g
    for bad, reason in (
        ({**body, "extra": 1}, "unknown keys"),
        ({k: v for k, v in body.items() if k != "top_p_milli"}, "missing"),
        ({**body, "group_size": "8"}, "integer"),
        ({**body, "group_size": True}, "integer"),
        ({**body, "group_size": 1}, "group_size"),
        ({**body, "stop_token_ids": [1] * 65}, "at most"),
        ([], "object"),
    ):
        with pytest.raises(MessageError, match=reason):
            parse_section(GenerationSpec, bad, "generation")


def test_model_and_prompt_checks() -> None:
    m = ModelSpec("m", "hf", "LlamaForCausalLM", "bfloat16", 10, H, H, H, H, 1)
    assert parse_section(ModelSpec, section_body(m), "model") == m
    with pytest.raises(MessageError, match="weights_hash"):
        parse_section(ModelSpec, {**section_body(m), "weights_hash": "XY"}, "model")
    with pytest.raises(MessageError, match="bfloat16"):
        parse_section(ModelSpec, {**section_body(m), "dtype": "float32"}, "model")
    with pytest.raises(MessageError, match="raw or chat"):
        parse_section(PromptSpec, {"format": "jinja", "system": ""}, "prompt")
    with pytest.raises(MessageError, match="values"):
        parse_section(TaskSpec, {"name": "t", "params": {"x": [1]}, "data_sha256": ""}, "task")
