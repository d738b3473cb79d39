"""Parts' public names: each resolves to what its module defines, loaded only when first asked for."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from p2prl.lazyexports import declared

PARTS = ["crypto", "protocol", "store", "testbed", "net", "patch", "rl", "proof", "dashboard", "netsim", "node", "demo"]


def test_a_declared_name_loads_its_module_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING

            from p2prl.lazyexports import lazy_exports

            if TYPE_CHECKING:
                from lazypkg.heavy import Thing as Renamed, helper

            __getattr__ = lazy_exports(__name__)
            """
        )
    )
    (pkg / "heavy.py").write_text("class Thing: ...\n\ndef helper() -> int:\n    return 7\n")
    (pkg / "other.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazypkg = importlib.import_module("lazypkg")
    assert "lazypkg.heavy" not in sys.modules
    assert lazypkg.helper() == 7
    assert "lazypkg.heavy" in sys.modules
    assert lazypkg.Renamed is sys.modules["lazypkg.heavy"].Thing
    from lazypkg import other  # a submodule not declared is still importable

    assert other.VALUE == 3
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = lazypkg.missing
    for name in ("lazypkg", "lazypkg.heavy", "lazypkg.other"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("part", PARTS)
def test_public_names_resolve_and_none_is_a_module_name(part: str) -> None:
    """A name equal to a submodule's would be replaced by the submodule once that is imported."""
    mod = importlib.import_module(f"p2prl.{part}")
    submodules = {m.name for m in pkgutil.iter_modules(mod.__path__)}
    assert not submodules & set(mod.__all__)
    lazy = declared(str(mod.__file__))
    for name in mod.__all__:
        value = getattr(mod, name)
        if name in lazy:
            module, attr = lazy[name]
            assert value is getattr(importlib.import_module(module), attr)


def test_importing_every_part_loads_no_torch_and_no_libp2p() -> None:
    code = (
        "import sys\n"
        + "".join(f"import p2prl.{p}\n" for p in PARTS)
        + "print(sorted(m for m in ('torch', 'transformers', 'libp2p', 'trio', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
