"""docs/PROTOCOL.md §9: the derived-hash examples are what the code computes, and agree with the text."""

import hashlib
import io
import tarfile
from pathlib import Path

import blake3

from p2prl.rl.hashexamples import SECTION, TOKENIZER_FILES, model_dir, render, weights_state, weights_stream
from p2prl.rl.modeldir import pack_files, tokenizer_sha256, unpack_files

SPEC = Path(__file__).parents[2] / "docs" / "PROTOCOL.md"


def test_the_spec_prints_exactly_these_examples() -> None:
    """Regenerate with: python -m p2prl.rl.hashexamples."""
    text = SPEC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    assert text[start : end if end >= 0 else len(text)].rstrip("\n") == render().rstrip("\n")


def test_the_hashes_follow_the_written_rules(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    d = model_dir(tmp_path / "m")
    # tokenizer: the raw 32-byte digests, no separator between files
    pre = b"p2prl/tokenizer/v1\x00" + b"".join(
        n.encode() + b"\x00" + hashlib.sha256(TOKENIZER_FILES[n].encode()).digest() for n in sorted(TOKENIZER_FILES)
    )
    assert tokenizer_sha256(d) == hashlib.sha256(pre).hexdigest()
    # the model_files tar: sorted names, mode 0644, no owners, zero times, a whole 10,240-byte record
    tar = pack_files(d)
    assert len(tar) % 10240 == 0
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        ms = tf.getmembers()
    assert [m.name for m in ms] == sorted(m.name for m in ms)
    assert all((m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) == (0o644, 0, 0, "", "", 0) for m in ms)
    assert sorted(unpack_files(tar, tmp_path / "out")) == sorted(m.name for m in ms)
    # weights: BLAKE3 of the stream written from §4
    stream = b"".join(p for p, _ in weights_stream(weights_state()))
    from p2prl.patch import weights_hash

    assert weights_hash(weights_state()) == blake3.blake3(stream).hexdigest()
