"""A stand-in genesis model section for tests that sign genesis files without building a model."""

from p2prl.protocol.sections import ModelSpec

MODEL = ModelSpec(
    name="m",
    source="builtin",
    architecture="Qwen2ForCausalLM",
    dtype="bfloat16",
    parameters=1,
    weights_hash="ab" * 32,
    config_sha256="cd" * 32,
    tokenizer_sha256="ef" * 32,
    files_sha256="",
    files_size=0,
)
