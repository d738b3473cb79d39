"""Canonical encoding of control objects: one byte string per value, so signatures are stable.

Encoding (see docs/PROTOCOL.md): UTF-8 JSON with object keys sorted by code point, no
insignificant whitespace, ``ensure_ascii``, integers in decimal, no floats (scaled integers are
used instead, so every implementation agrees on the bytes), byte strings as lowercase hex text.
Decoding accepts only bytes that re-encode to themselves, so no two encodings of one value exist.
"""

from __future__ import annotations

import json
from typing import Any

from p2prl.errors import PeerInputError
from p2prl.reasons import InputReason

MAX_DEPTH = 16
INT_BOUND = 2**63
_INT_DIGITS = len(str(INT_BOUND))  # 19: a longer decimal literal cannot be in range


class CanonicalError(PeerInputError, ValueError):
    """A value that cannot be canonically encoded, or bytes that are not a canonical encoding
    (reason ``bad_body``; whatever wraps it, an envelope or a patch header, names its own)."""


def _check(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalError(InputReason.BAD_BODY, "nesting too deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        _check_text(value)
        return
    if isinstance(value, int):
        if not -INT_BOUND <= value < INT_BOUND:
            raise CanonicalError(InputReason.BAD_BODY, "integer out of 64-bit range")
        return
    if isinstance(value, float):
        raise CanonicalError(InputReason.BAD_BODY, "floats are not canonical; use scaled integers")
    if isinstance(value, (list, tuple)):
        for v in value:
            _check(v, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise CanonicalError(InputReason.BAD_BODY, f"object keys must be strings, got {type(k).__name__}")
            _check_text(k)
            _check(v, depth + 1)
        return
    raise CanonicalError(InputReason.BAD_BODY, f"type {type(value).__name__} is not encodable")


def _check_text(s: str) -> None:
    """Strings must be Unicode scalar values: a lone surrogate (``"\\ud800"``) is refused, since
    other languages' JSON libraries reject or silently replace it and would sign other bytes."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalError(InputReason.BAD_BODY, "string holds a lone UTF-16 surrogate") from None


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of a JSON-like value (dict/list/str/int/bool/None)."""
    _check(value)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def canonical_loads(data: bytes, *, max_bytes: int | None = None) -> Any:
    """Parse bytes that must be a canonical encoding; raises CanonicalError otherwise."""
    if max_bytes is not None and len(data) > max_bytes:
        raise CanonicalError(InputReason.BAD_BODY, f"{len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        value = json.loads(
            data.decode("ascii"),
            parse_float=_reject_float,
            parse_constant=_reject_float,
            parse_int=_parse_int,
        )
    except RecursionError as e:
        raise CanonicalError(InputReason.BAD_BODY, "nesting too deep") from e
    except CanonicalError:
        raise
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and any conversion limit
        raise CanonicalError(InputReason.BAD_BODY, f"not canonical JSON: {e}") from e
    if canonical_bytes(value) != data:
        raise CanonicalError(InputReason.BAD_BODY, "bytes are not in canonical form")
    return value


def _parse_int(s: str) -> int:
    # checked on the digits, before int(): a 5,000-digit literal would otherwise raise Python's
    # conversion-limit ValueError (or, below it, cost quadratic time) instead of a reason code
    if len(s.lstrip("-")) > _INT_DIGITS:
        raise CanonicalError(InputReason.BAD_BODY, f"integer of {len(s)} characters is out of 64-bit range")
    return int(s)


def _reject_float(s: str) -> Any:
    raise CanonicalError(InputReason.BAD_BODY, f"non-integer number {s!r} in canonical data")
