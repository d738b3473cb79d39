"""Find the commands a reader is told to type: fenced ``bash``/``console`` blocks of the Markdown docs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cli_check import p2prl_argv, split_segments, substitutions

SHELL_LANGS = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w-]*)")

# `docker run` options that take no value (all others take one, unless written --opt=value).
_DOCKER_FLAGS = {"--rm", "-d", "-i", "-t", "-it", "-ti", "--detach", "--interactive", "--tty", "--init"}


@dataclass(frozen=True)
class ShellLine:
    """One command line of a doc (continuations joined), where it is, and how it is fenced."""

    file: Path
    lineno: int
    text: str
    lang: str

    @property
    def where(self) -> str:
        return f"{self.file.name}:{self.lineno}"


@dataclass(frozen=True)
class DocCommand:
    """A p2prl invocation inside a doc line: directly, or as the arguments of a p2prl container."""

    line: ShellLine
    argv: tuple[str, ...]
    in_container: bool


def shell_lines(path: Path) -> list[ShellLine]:
    """Command lines of the shell-like fenced blocks; in ``console`` blocks only ``$ `` lines count.

    In blocks without a language, only lines that start with ``p2prl`` (or ``$ p2prl``) count.
    """
    out: list[ShellLine] = []
    fence: str | None = None
    lang = ""
    pending: list[str] = []
    start = 0
    for i, raw in enumerate(path.read_text().splitlines(), start=1):
        m = _FENCE.match(raw)
        if fence is None:
            if m:
                fence, lang = m.group(2), m.group(3).lower()
            continue
        if m and m.group(2).startswith(fence) and not m.group(3):
            fence, pending = None, []
            continue
        line = raw.strip()
        # an unlabelled block counts only for its lines that run p2prl
        if lang not in SHELL_LANGS and (lang or (not pending and not re.match(r"^(\$ )?p2prl\b", line))):
            continue
        if not pending:
            if lang == "console" or (not lang and line.startswith("$ ")):
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line or line.startswith("#"):
                continue
            start = i
        if line.endswith("\\"):
            pending.append(line[:-1].rstrip())
            continue
        text = " ".join([*pending, line]).strip()
        pending = []
        out.append(ShellLine(path, start, text, lang))
    return out


_INLINE = re.compile(r"(?<!`)`(p2prl [^`]+)`(?!`)")


def _synopsis(text: str) -> str:
    """Usage notation in prose to a plain command.

    ``[--json]`` is checked as ``--json`` and ``[--network NET]`` as ``--network NET``; a repeated
    group such as ``[--node …]`` is dropped, and so is a ``…`` after a value (``ADDR…``).
    """
    text = re.sub(r"\[[^\[\]]*(…|\.\.\.)[^\[\]]*\]", " ", text)
    text = text.replace("[", " ").replace("]", " ").replace("…", " ").replace("...", " ")
    return re.sub(r"\s+", " ", text).strip()


def inline_commands(path: Path) -> list[ShellLine]:
    """``p2prl ...`` written as inline code in the prose (outside fenced blocks)."""
    out: list[ShellLine] = []
    fence: str | None = None
    for i, raw in enumerate(path.read_text().splitlines(), start=1):
        m = _FENCE.match(raw)
        if fence is None and m:
            fence = m.group(2)
            continue
        if fence is not None:
            if m and m.group(2).startswith(fence) and not m.group(3):
                fence = None
            continue
        out += [ShellLine(path, i, _synopsis(t), "inline") for t in _INLINE.findall(raw)]
    return out


def fenced_blocks(path: Path, lang: str) -> list[tuple[int, str]]:
    """(first line number, text) of each fenced block in ``lang``."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    cur: list[str] = []
    start = 0
    for i, raw in enumerate(path.read_text().splitlines(), start=1):
        m = _FENCE.match(raw)
        if fence is None:
            if m and m.group(3).lower() == lang:
                fence, cur, start = m.group(2), [], i + 1
            elif m:
                fence, start = m.group(2), -1
            continue
        if m and m.group(2).startswith(fence) and not m.group(3):
            if start > 0:
                out.append((start, "\n".join(cur) + "\n"))
            fence = None
            continue
        cur.append(raw)
    return out


# A placeholder such as ``<trainer peer id>`` is one value, whatever its spaces.
_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a line, those inside command substitutions included."""
    text = _PLACEHOLDER.sub(lambda m: m.group(0).replace(" ", "_"), text)
    rest, subs = substitutions(text)
    cmds: list[list[str]] = []
    for part in [*subs, rest]:
        cmds += split_segments(part)
    return cmds


def _docker_argv(tokens: list[str]) -> list[str] | None:
    """p2prl arguments of ``docker run ... IMAGE ARGS`` or ``docker compose ... run|exec SERVICE p2prl ARGS``."""
    if len(tokens) < 2 or tokens[0] != "docker":
        return None
    if tokens[1] == "run":
        i = 2
        while i < len(tokens) and tokens[i].startswith("-"):
            if tokens[i] == "--entrypoint":
                return None
            i += 1 if (tokens[i] in _DOCKER_FLAGS or "=" in tokens[i]) else 2
        if i >= len(tokens):
            return None
        image = tokens[i].split("@")[0].rsplit(":", 1)[0]
        if image.rsplit("/", 1)[-1] != "p2prl":
            return None
        return tokens[i + 1 :]
    if tokens[1] == "compose" and "p2prl" in tokens:
        return tokens[tokens.index("p2prl") + 1 :]
    return None


def doc_commands(line: ShellLine) -> list[DocCommand]:
    found: list[DocCommand] = []
    for seg in simple_commands(line.text):
        argv = p2prl_argv(seg)
        if argv is not None:
            found.append(DocCommand(line, tuple(argv), in_container=False))
            continue
        argv = _docker_argv(seg)
        if argv:
            found.append(DocCommand(line, tuple(argv), in_container=True))
    return found
