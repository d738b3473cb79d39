"""Wire objects (DESIGN §2): typed bodies of signed envelopes, with their bounds, and blob refs."""

from p2prl.protocol.blobs import (
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    MIN_CHUNK_SIZE,
    BlobRef,
    blob_ref_for,
    chunk_spans,
)
from p2prl.protocol.fields import is_hex
from p2prl.protocol.messages import (
    MAX_ENVELOPE_BYTES,
    Genesis,
    GroupVerdict,
    Heartbeat,
    MessageError,
    PatchManifest,
    RolloutAnnouncement,
    Scores,
    Verdict,
    decode_message,
    encode_message,
)
from p2prl.protocol.sections import (
    AssetSpec,
    GenerationSpec,
    ModelSpec,
    PatchSpec,
    PromptSpec,
    S3Spec,
    TaskSpec,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNKS",
    "MAX_CHUNK_SIZE",
    "MAX_ENVELOPE_BYTES",
    "MIN_CHUNK_SIZE",
    "AssetSpec",
    "BlobRef",
    "GenerationSpec",
    "Genesis",
    "GroupVerdict",
    "Heartbeat",
    "MessageError",
    "ModelSpec",
    "PatchManifest",
    "PatchSpec",
    "PromptSpec",
    "RolloutAnnouncement",
    "S3Spec",
    "Scores",
    "TaskSpec",
    "Verdict",
    "blob_ref_for",
    "chunk_spans",
    "decode_message",
    "encode_message",
    "is_hex",
]
