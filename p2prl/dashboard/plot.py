"""A PNG chart of a run's reward and acceptance per version, drawn with the standard library only.

``p2prl demo --reward-png`` writes it: a plotting library would be a heavy dependency for one chart,
and a PNG is rows of RGB bytes, zlib-compressed, in three checksummed chunks. Both series share the
y axis 0..1 (a task's reward is a share of the points, acceptance a share of the rollouts; a larger
reward widens the axis); the labels use a 5x7 bitmap font of the few characters they need.

One version's mean reward is a few hundred rollouts and moves by ±0.1 from one to the next, so the
per-version reward is a thin light line and a moving average over about a tenth of the run (weighted
by rollouts) the thick one: whether anything was learned shows at a glance. The last version is the
one the run ended on, with only the rollouts that arrived before the end (and so are those before it
the trainer took nothing of yet): grey dots, left out of the lines, not a dip.
"""

from __future__ import annotations

import struct
import zlib
from itertools import pairwise
from pathlib import Path
from typing import Any

REWARD_RGB = (31, 119, 180)  # blue: the smoothed reward
RAW_RGB = (170, 199, 232)  # light blue: the reward of each version
LAST_RGB = (150, 150, 150)  # grey: the unfinished last version
ACCEPT_RGB = (44, 160, 44)  # green
GRID_RGB = (225, 225, 225)
AXIS_RGB = (90, 90, 90)

# 5x7 glyphs, seven rows of five ("#" set), only what the labels use
_GLYPHS = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "####. ....# ....# .###. ....# ....# ####.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    "v": "..... ..... #...# #...# #...# .#.#. ..#..",
    "r": "..... ..... #.##. ##..# #.... #.... #....",
    "e": "..... ..... .###. #...# ##### #.... .###.",
    "w": "..... ..... #...# #...# #.#.# #.#.# .#.#.",
    "a": "..... ..... .###. ....# .#### #...# .####",
    "d": "....# ....# .##.# #..## #...# #...# .####",
    "c": "..... ..... .###. #.... #.... #...# .###.",
    "p": "..... ..... ####. #...# ####. #.... #....",
    "t": ".#... .#... ###.. .#... .#... .#..# ..##.",
    "s": "..... ..... .#### #.... .###. ....# ####.",
    "i": "..#.. ..... .##.. ..#.. ..#.. ..#.. .###.",
    "o": "..... ..... .###. #...# #...# #...# .###.",
    "n": "..... ..... #.##. ##..# #...# #...# #...#",
}


class Canvas:
    """An RGB raster with the few drawing operations the chart needs."""

    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(rgb)

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, rgb)

    def line(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int], thick: int = 1) -> None:
        """Bresenham's line, ``thick`` pixels square."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.rect(x0, y0, x0 + thick - 1, y0 + thick - 1, rgb)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, s: str, rgb: tuple[int, int, int] = AXIS_RGB) -> int:
        """Draw ``s`` with its top-left at (x, y); returns the x after it. Unknown characters: a gap."""
        for ch in s:
            for row, bits in enumerate(_GLYPHS.get(ch, "").split()):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.set(x + col, y + row, rgb)
            x += 6
        return x

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v else "0"


def unfinished_tail(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(finished rows, unfinished ones)``: the run ended on the last version, and the versions
    before it that the trainer took no rollout of were still being made and judged — their figures
    are of whatever arrived before the end (nothing is set apart from fewer than two rows)."""
    if len(rows) < 2:
        return rows, []
    k = len(rows) - 1
    while k > 0 and not rows[k - 1].get("rollouts_trained"):
        k -= 1
    return rows[:k], rows[k:]


def smoothed_reward(rows: list[dict[str, Any]], span: int | None = None) -> list[tuple[int, float]]:
    """``(version, mean reward)`` averaged over the ``span`` versions around each (default: a tenth
    of the run, at least 3), each version weighted by the rollouts its mean is of."""
    pts = [
        (int(r["version"]), float(r["reward_mean"]), max(1, int(r.get("rollouts_trained") or 1)))
        for r in rows
        if r.get("reward_mean") is not None
    ]
    half = max(1, (span if span is not None else max(3, len(pts) // 10)) // 2)
    out = []
    for i, (v, _, _) in enumerate(pts):
        win = pts[max(0, i - half) : i + half + 1]
        out.append((v, sum(m * n for _, m, n in win) / sum(n for _, _, n in win)))
    return out


def reward_chart(rows: list[dict[str, Any]], width: int = 720, height: int = 400) -> bytes:
    """The PNG of ``rows`` (``p2prl.dashboard.per_version``): reward smoothed (blue) and per version
    (light blue), acceptance (green), the unfinished last versions grey dots."""
    c = Canvas(width, height)
    left, right, top, bottom = 44, width - 16, 28, height - 34
    versions = [int(r["version"]) for r in rows]
    v0, v1 = (min(versions), max(versions)) if versions else (0, 1)
    rewards = [float(r["reward_mean"]) for r in rows if r.get("reward_mean") is not None]
    ymax = max(1.0, *rewards) if rewards else 1.0

    def xy(v: int, y: float) -> tuple[int, int]:
        fx = (v - v0) / (v1 - v0) if v1 > v0 else 0.5
        return round(left + fx * (right - left)), round(bottom - min(y, ymax) / ymax * (bottom - top))

    for k in range(5):
        y = ymax * k / 4
        _, py = xy(v0, y)
        c.line(left, py, right, py, GRID_RGB)
        c.text(4, py - 3, _fmt(y))
    c.line(left, top, left, bottom, AXIS_RGB)
    c.line(left, bottom, right, bottom, AXIS_RGB)
    c.text(left, bottom + 8, f"v{v0}")
    c.text(right - 6 * len(f"v{v1}"), bottom + 8, f"v{v1}")
    c.text((left + right) // 2 - 21, bottom + 20, "version")
    done, tail = unfinished_tail(rows)
    smooth = smoothed_reward(done)
    series = [
        ([(int(r["version"]), r.get("acceptance")) for r in done], ACCEPT_RGB, 2),
        ([(int(r["version"]), r.get("reward_mean")) for r in done], RAW_RGB, 1),
        (smooth, REWARD_RGB, 3),
    ]
    for values, rgb, thick in series:
        pts = [xy(v, float(y)) for v, y in values if y is not None]
        for (x0, y0), (x1, y1) in pairwise(pts):
            c.line(x0, y0, x1, y1, rgb, thick=thick)
        if len(pts) == 1:
            c.rect(pts[0][0] - 1, pts[0][1] - 1, pts[0][0] + 1, pts[0][1] + 1, rgb)
    for r in tail:
        for key in ("reward_mean", "acceptance"):
            if r.get(key) is not None:
                px, py = xy(int(r["version"]), float(r[key]))
                c.rect(px - 2, py - 2, px + 2, py + 2, LAST_RGB)
    x = left + 8
    for label, rgb in (("reward", REWARD_RGB), ("per version", RAW_RGB), ("accepted", ACCEPT_RGB)):
        c.rect(x, 10, x + 12, 16, rgb)
        x = c.text(x + 18, 10, label) + 16
    return c.png()


def write_chart(rows: list[dict[str, Any]], path: Path | str) -> None:
    Path(path).write_bytes(reward_chart(rows))
