"""Typed genesis sections: a body is parsed once, strictly; anything off the declaration is refused."""

import pytest

from p2prl.protocol.fields import MessageError
from p2prl.protocol.sections import (
    GenerationSpec,
    ModelSpec,
    PatchSpec,
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
        ({**body, "stop_token_ids": [-1]}, "non-negative"),  # section integers are in [0, 2^62]
        ({**body, "temperature_milli": 2**62 + 1}, "non-negative"),
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
    with pytest.raises(MessageError, match="needs --prompt-format chat"):
        parse_section(PromptSpec, {"format": "raw", "system": "Be brief."}, "prompt")
    with pytest.raises(MessageError, match="raw or chat"):
        parse_section(PromptSpec, {"format": "jinja", "system": ""}, "prompt")
    with pytest.raises(MessageError, match="values"):
        parse_section(TaskSpec, {"name": "t", "params": {"x": [1]}, "data_sha256": ""}, "task")


def test_builtin_model_carries_no_files_blob() -> None:
    """The spec's builtin model has files_sha256 "" (every node rebuilds its files): a genesis naming a
    files blob for it was accepted."""
    m = ModelSpec("m", "builtin", "Qwen2ForCausalLM", "bfloat16", 10, H, H, H, "", 0)
    assert parse_section(ModelSpec, section_body(m), "model") == m
    for bad in ({"files_sha256": H, "files_size": 1}, {"files_sha256": H}, {"files_size": 5}):
        with pytest.raises(MessageError, match="builtin"):
            parse_section(ModelSpec, {**section_body(m), **bad}, "model")


def test_patch_chunk_size_is_a_blob_chunk_size() -> None:
    """patch.chunk_size is the chunk size of every patch and anchor blob, so it has a BlobRef's range
    (16 KiB..16 MiB); 1 byte and 16 MiB + 1 were accepted and the trainer failed at its first publish."""
    for ok in (16 * 1024, 1 << 20, 16 << 20):
        body = {"anchor_interval": 10, "chunk_size": ok}
        assert parse_section(PatchSpec, body, "patch").chunk_size == ok
    for bad in (1, 16 * 1024 - 1, (16 << 20) + 1, 64 << 20):
        with pytest.raises(MessageError, match="chunk_size"):
            parse_section(PatchSpec, {"anchor_interval": 10, "chunk_size": bad}, "patch")
