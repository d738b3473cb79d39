"""Every error a peer's input can raise has one shape: a reason code first, then the detail."""

import pytest

from p2prl.crypto.canonical import CanonicalError, canonical_loads
from p2prl.crypto.envelope import EnvelopeError, open_envelope
from p2prl.errors import PeerInputError
from p2prl.patch import PatchError, inspect_patch
from p2prl.proof.batch import BatchError, decode_batch
from p2prl.protocol import MessageError
from p2prl.protocol.messages import Verdict
from p2prl.reasons import InputReason, PatchReason, VerdictReason


@pytest.mark.parametrize("cls", [EnvelopeError, MessageError, BatchError, PatchError, CanonicalError])
def test_one_argument_order(cls):
    e = cls("some_code", "what\nwent   wrong")
    assert isinstance(e, PeerInputError)
    assert (e.reason, e.detail, str(e)) == ("some_code", "what went wrong", "some_code: what went wrong")
    assert str(cls("some_code")) == "some_code"


def test_value_error_stays_where_it_was():
    """Callers catch ValueError around envelopes, messages and batches, not around the patch codec
    (whose applier turns ValueErrors from numpy into PatchError)."""
    assert all(issubclass(c, ValueError) for c in (EnvelopeError, MessageError, BatchError, CanonicalError))
    assert not issubclass(PatchError, ValueError)


def test_each_part_raises_its_reasons():
    with pytest.raises(EnvelopeError) as env:
        open_envelope(b"junk", "net")
    with pytest.raises(MessageError) as msg:
        Verdict.from_body({"groups": "no"})
    with pytest.raises(BatchError) as batch:
        decode_batch(b"junk")
    with pytest.raises(PatchError) as patch:
        inspect_patch(b"junk")
    with pytest.raises(CanonicalError) as canon:
        canonical_loads(b'{"a": 1}')
    assert env.value.reason is InputReason.BAD_MAGIC
    assert msg.value.reason is InputReason.BAD_BODY
    assert batch.value.reason is VerdictReason.BATCH_MALFORMED
    assert patch.value.reason is PatchReason.MALFORMED
    assert canon.value.reason is InputReason.BAD_BODY
