"""A part's public names loaded on first use, for the parts whose modules import torch or libp2p.

Every import of a part's module first runs the part's ``__init__``; were that ``__init__`` to import
its heavy modules, ``p2prl patch diff`` would load torch and the network simulator libp2p. So such a
part declares its public names once, under ``if TYPE_CHECKING:`` (read by type checkers and by
``lint-imports``), and sets ``__getattr__ = lazy_exports(__name__)``, which loads a name's module
when the name is first asked for.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def declared(init_file: str) -> dict[str, tuple[str, str]]:
    """``name -> (module, attribute)`` for each ``from M import A [as name]`` under ``if TYPE_CHECKING:``."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.parse(Path(init_file).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    for alias in stmt.names:
                        out[alias.asname or alias.name] = (stmt.module, alias.name)
    return out


def lazy_exports(package: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: imports a declared name's module, keeps the name."""
    table: dict[str, tuple[str, str]] = {}

    def __getattr__(name: str) -> Any:
        mod = sys.modules[package]
        if not table:
            table.update(declared(str(mod.__file__)))
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = table[name]
        value = getattr(importlib.import_module(module), attr)
        setattr(mod, name, value)
        return value

    return __getattr__
