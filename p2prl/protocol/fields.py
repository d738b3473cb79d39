"""Checked field readers for bodies from peers: every read validates type and bound."""

from __future__ import annotations

import re
from typing import Any

from p2prl.errors import PeerInputError
from p2prl.reasons import InputReason

_HEX_RE = re.compile(r"[0-9a-f]*")


class MessageError(PeerInputError, ValueError):
    """A body that does not match its type's schema; ``reason`` is an ``InputReason``."""


def bad_body(detail: str) -> MessageError:
    """The error for a body that breaks its schema (nearly every refusal of a parsed body)."""
    return MessageError(InputReason.BAD_BODY, detail)


def req(body: dict[str, Any], key: str) -> Any:
    if key not in body:
        raise bad_body(f"missing field {key!r}")
    return body[key]


def int_field(body: dict[str, Any], key: str, lo: int = 0, hi: int = 2**62) -> int:
    v = req(body, key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise bad_body(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def str_field(
    body: dict[str, Any], key: str, max_len: int = 256, choices: tuple[str, ...] | None = None
) -> str:
    v = req(body, key)
    if not isinstance(v, str) or len(v) > max_len:
        raise bad_body(f"{key} must be a string of at most {max_len} chars")
    if choices is not None and v not in choices:
        raise bad_body(f"{key} must be one of {choices}")
    return v


def hex_field(body: dict[str, Any], key: str, nbytes: int) -> str:
    v = req(body, key)
    check_hex(v, nbytes, key)
    return v


def is_hex(v: Any, nbytes: int | None = None) -> bool:
    """``v`` is lowercase hex (of exactly ``nbytes`` bytes when given): the one spelling of keys,
    hashes and blob ids, and the one check of it (a whole-string match: no trailing newline slips by)."""
    return (
        isinstance(v, str)
        and (len(v) == 2 * nbytes if nbytes is not None else len(v) % 2 == 0)
        and _HEX_RE.fullmatch(v) is not None
    )


def check_hex(v: Any, nbytes: int, what: str) -> None:
    if not is_hex(v, nbytes):
        raise bad_body(f"{what} must be {nbytes} bytes of lowercase hex")


def list_field(body: dict[str, Any], key: str, max_len: int) -> list[Any]:
    v = req(body, key)
    if not isinstance(v, list) or len(v) > max_len:
        raise bad_body(f"{key} must be a list of at most {max_len} items")
    return v


def dict_field(body: dict[str, Any], key: str) -> dict[str, Any]:
    v = req(body, key)
    if not isinstance(v, dict):
        raise bad_body(f"{key} must be an object")
    return v


def bool_field(body: dict[str, Any], key: str) -> bool:
    v = req(body, key)
    if not isinstance(v, bool):
        raise bad_body(f"{key} must be a boolean")
    return v


def is_multiaddr(text: str) -> bool:
    """Whether ``text`` is a multiaddr in its canonical text form (what the ``multiaddr`` library parses
    and writes back unchanged): ``/ip4/192.0.2.1/tcp/4001/p2p/<peer id>``, not ``hello``."""
    import multiaddr  # a dependency of libp2p; imported here, where a genesis is parsed
    from multiaddr.exceptions import Error as MultiaddrError

    if not text.startswith("/"):
        return False
    try:
        return str(multiaddr.Multiaddr(text)) == text
    except (MultiaddrError, ValueError, TypeError, KeyError, IndexError):
        return False
