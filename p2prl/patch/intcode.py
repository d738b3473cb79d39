"""Vectorised integer codings for index and value streams (no per-element Python loops).

- zig-zag of the wrapped integer difference of bit patterns (exact for any width);
- gaps of sorted positions as LEB128 varints, or as uint16 with escapes to a uint32 side array;
- byte shuffle (Blosc-style planes) so zstd sees the mostly-zero high bytes together.
"""

from __future__ import annotations

import numpy as np

from p2prl.patch.errors import PatchError, PatchReason

U16_ESCAPE = 0xFFFF


def zigzag_diff(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Zig-zag code of (new - old) mod 2^w, both unsigned arrays of one width w."""
    bits = new.dtype.itemsize * 8
    d = (new - old).view(np.dtype(f"i{new.dtype.itemsize}"))
    return ((d << 1) ^ (d >> (bits - 1))).view(new.dtype)


def unzigzag_add(old: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Inverse of zigzag_diff: old + unzigzag(z) mod 2^w."""
    one = z.dtype.type(1)
    d = (z >> one) ^ (z.dtype.type(0) - (z & one))
    return old + d


def shuffle(a: np.ndarray) -> bytes:
    """Byte planes: all first bytes, then all second bytes, ... (little-endian element order)."""
    w = a.dtype.itemsize
    if w == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, w).T).tobytes()


def unshuffle(buf: bytes | memoryview, dtype: type[np.unsignedinteger], n: int) -> np.ndarray:
    """Inverse of shuffle, for exactly ``n`` elements: the planes are widened and or-ed together,
    highest first (contiguous passes only)."""
    w = np.dtype(dtype).itemsize
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.size != n * w:
        raise PatchError(PatchReason.MALFORMED, f"value stream has {raw.size} bytes, expected {n * w}")
    if w == 1:
        return raw.copy()
    out = raw[(w - 1) * n :].astype(dtype)
    shift = dtype(8)
    for k in range(w - 2, -1, -1):
        out <<= shift
        out |= raw[k * n : (k + 1) * n]
    return out


def positions_to_gaps(pos: np.ndarray) -> np.ndarray:
    """Sorted distinct positions -> gaps (first position, then distance - 1), as uint32."""
    g = np.empty(pos.size, dtype=np.uint32)
    if pos.size:
        g[0] = pos[0]
        np.subtract(pos[1:], pos[:-1], out=g[1:], casting="unsafe")
        g[1:] -= 1
    return g


def gaps_to_positions(g: np.ndarray, span: int) -> np.ndarray:
    """Inverse of positions_to_gaps; raises PatchError if a position falls outside [0, span)."""
    pos = np.add(g, 1, dtype=np.int64)  # each gap plus the position it steps over, summed in place
    np.cumsum(pos, out=pos)
    pos -= 1
    if pos.size and pos[-1] >= span:
        raise PatchError(PatchReason.MALFORMED, f"index {int(pos[-1])} outside a span of {span}")
    return pos


# -- LEB128 ------------------------------------------------------------------------------------


def leb128_encode(g: np.ndarray) -> bytes:
    g = g.astype(np.uint32, copy=False)
    nb = np.ones(g.size, dtype=np.int64)
    for k in (7, 14, 21, 28):
        nb += g >= (1 << k)
    ends = np.cumsum(nb)
    out = np.empty(int(ends[-1]) if g.size else 0, dtype=np.uint8)
    starts = ends - nb
    for k in range(5):
        sel = np.flatnonzero(nb > k) if k else None
        if sel is not None and sel.size == 0:
            break
        vals = g if sel is None else g[sel]
        byte = ((vals >> np.uint32(7 * k)) & np.uint32(0x7F)).astype(np.uint8)
        more = (nb > k + 1) if sel is None else (nb[sel] > k + 1)
        byte |= more.astype(np.uint8) << 7
        out[starts if sel is None else starts[sel] + k] = byte
    return out.tobytes()


def leb128_decode(buf: bytes | memoryview, n: int) -> np.ndarray:
    """Exactly ``n`` canonical uint32 varints filling ``buf``; PatchError otherwise."""
    b = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != n or (n and ends[-1] != b.size - 1) or (n == 0 and b.size):
        raise PatchError(PatchReason.MALFORMED, "LEB128 stream does not hold the declared number of values")
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max() > 5:
        raise PatchError(PatchReason.MALFORMED, "LEB128 value longer than 5 bytes")
    out = np.zeros(n, dtype=np.uint64)
    for k in range(5):
        sel = np.flatnonzero(lens > k)
        if sel.size == 0:
            break
        out[sel] |= (b[starts[sel] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    if out.max() >= 1 << 32:
        raise PatchError(PatchReason.MALFORMED, "LEB128 value exceeds 32 bits")
    # canonical: no trailing zero continuation byte (a multi-byte value's last byte is non-zero)
    if np.any((lens > 1) & (b[ends] == 0)):
        raise PatchError(PatchReason.MALFORMED, "LEB128 value is not minimally encoded")
    return out.astype(np.uint32)


# -- uint16 with escape ------------------------------------------------------------------------


def u16esc_encode(g: np.ndarray) -> bytes:
    """uint16 per gap (shuffled into byte planes); gaps >= 0xFFFF are 0xFFFF plus a uint32 appended."""
    g = g.astype(np.uint32, copy=False)
    esc = g >= U16_ESCAPE
    main = np.minimum(g, U16_ESCAPE).astype(np.uint16)
    return shuffle(main) + g[esc].astype("<u4").tobytes()


def u16esc_decode(buf: bytes | memoryview, n: int) -> np.ndarray:
    """The gaps of a u16esc stream: uint16 when none is escaped (no widening pass), else uint32."""
    mv = memoryview(buf)
    if len(mv) < 2 * n:
        raise PatchError(PatchReason.MALFORMED, "uint16 index stream shorter than its count")
    main = unshuffle(mv[: 2 * n], np.uint16, n)
    if len(mv) == 2 * n:  # no escape section: no gap may be escaped
        if n and int(main.max()) == U16_ESCAPE:
            raise PatchError(PatchReason.MALFORMED, "uint16 index stream escape section has the wrong length")
        return main
    esc = np.flatnonzero(main == U16_ESCAPE)
    if len(mv) != 2 * n + 4 * esc.size:
        raise PatchError(PatchReason.MALFORMED, "uint16 index stream escape section has the wrong length")
    big = np.frombuffer(mv[2 * n :], dtype="<u4")
    if np.any(big < U16_ESCAPE):
        raise PatchError(PatchReason.MALFORMED, "escaped index gap is small enough for uint16")
    out = main.astype(np.uint32)
    out[esc] = big
    return out
