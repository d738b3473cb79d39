import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2prl.crypto.canonical import CanonicalError, canonical_bytes, canonical_loads

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow
@given(values)
def test_roundtrip_is_identity(v):
    b = canonical_bytes(v)
    assert canonical_loads(b) == v
    assert canonical_bytes(canonical_loads(b)) == b


def test_key_order_does_not_matter():
    assert (
        canonical_bytes({"b": 1, "a": [1, 2]})
        == canonical_bytes({"a": [1, 2], "b": 1})
        == b'{"a":[1,2],"b":1}'
    )


@pytest.mark.parametrize("bad", [1.5, float("nan"), {1: 2}, b"bytes", 2**64, object()])
def test_unencodable(bad):
    with pytest.raises(CanonicalError):
        canonical_bytes(bad)


@pytest.mark.parametrize(
    "data",
    [
        b'{"b":1,"a":2}',
        b'{"a": 1}',
        b'{"a":1.0}',
        b"[1,2",
        b'"\xff"',
        b'{"a":NaN}',
        b"[" * 5000 + b"]" * 5000,
        b'"\\u00e9"x',
        b'{"a":' + b"9" * 5000 + b"}",  # past Python's int conversion limit (docs/SECURITY.md, 17)
        b"[" + b"9" * 20 + b"]",
    ],
)
def test_non_canonical_bytes_rejected(data):
    with pytest.raises(CanonicalError):
        canonical_loads(data)


def test_size_bound():
    with pytest.raises(CanonicalError, match="limit"):
        canonical_loads(b'"' + b"a" * 100 + b'"', max_bytes=50)


@pytest.mark.parametrize("value", ["\ud800", "a\udfffb", {"\udc00": 1}, ["x", "\ud83d"]])
def test_lone_surrogates_are_refused_both_ways(value):
    with pytest.raises(CanonicalError, match="surrogate"):
        canonical_bytes(value)
    raw = json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(CanonicalError, match="surrogate"):
        canonical_loads(raw)


def test_a_surrogate_pair_is_one_character():
    assert canonical_loads(b'"\\ud83d\\ude00"') == "\U0001f600"
    assert canonical_bytes("\U0001f600") == b'"\\ud83d\\ude00"'


def test_del_is_escaped_and_a_raw_del_is_refused():
    assert canonical_bytes("a\x7fb") == b'"a\\u007fb"'
    with pytest.raises(CanonicalError):
        canonical_loads(b'"a\x7fb"')


def _nested(n: int, inner: object) -> object:
    for _ in range(n):
        inner = [inner]
    return inner


@pytest.mark.parametrize(
    ("n", "inner", "ok"),
    [(16, 1, True), (17, 1, False), (16, [], True), (17, [], False)],  # n arrays around inner
)
def test_depth_is_counted_as_the_spec_says(n, inner, ok):
    """§1: a value's depth is the number of arrays and objects around it, at most 16."""
    data = json.dumps(_nested(n, inner), separators=(",", ":")).encode()
    if ok:
        assert canonical_loads(data) == _nested(n, inner)
    else:
        with pytest.raises(CanonicalError, match="nesting"):
            canonical_loads(data)
