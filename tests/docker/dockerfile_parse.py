"""A small Dockerfile reader for the tests: stages, their instructions, the ENV an image starts with."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            stages.append(Stage(base=base, name=name))
        elif not stages:
            if keyword == "ARG":
                k, _, v = rest.partition("=")
                global_args[k] = v
        else:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


def image_env(path: Path) -> dict[str, str]:
    """The ENV of the final stage: what every container of the image starts with."""
    _, stages = parse_dockerfile(path)
    out: dict[str, str] = {}
    for k, a in stages[-1].instructions:
        if k == "ENV":
            out.update(dict(tok.split("=", 1) for tok in shlex.split(a)))
    return out
