"""Node processes import the package the demo imported, wherever the demo was started.

Run from a clone's parent (`bash p2prl/scripts/bootstrap.sh demo`), ``python -m p2prl`` found the
clone's folder first on ``sys.path`` and every node died on ``cannot import name '__version__'``.
"""

from pathlib import Path

import pytest

import p2prl
from p2prl.demo import Supervisor


@pytest.mark.parametrize("shadow", ["clone folder", "other package"])
def test_nodes_import_this_package_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shadow: str
) -> None:
    here = tmp_path / "cwd"
    fake = here / "p2prl"
    (fake / "scripts").mkdir(parents=True)
    (fake / "README.md").write_text("a clone of the repository\n")
    if shadow == "other package":  # a folder that is a package, not this one
        (fake / "__init__.py").write_text("raise ImportError('the folder in the working directory')\n")
        (fake / "__main__.py").write_text("raise SystemExit('the folder in the working directory')\n")
    monkeypatch.chdir(here)
    sup = Supervisor(tmp_path / "run")
    child = sup.spawn("probe", ["--help"])
    assert child.proc.wait(timeout=120) == 0, child.tail()
    sup.stop_all()
    text = (tmp_path / "run" / "logs" / "probe.log").read_text()
    assert "Usage" in text and "working directory" not in text, text[-2000:]
    assert Path(p2prl.__file__).resolve().parents[1] != here
