"""Task discovery: built-ins and ``p2prl.tasks`` entry points of distributions on ``sys.path``.

Each plugin here is a real distribution (a ``*.dist-info`` with ``entry_points.txt`` next to its module)
in a temporary directory put on ``sys.path``, found by ``importlib.metadata`` as an installed one is.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from p2prl.rl.tasks import (
    BUILTIN_TASKS,
    AdditionTask,
    available_tasks,
    file_sha256,
    get_task,
    parse_task_params,
    pin_task_params,
)

PLUGIN = textwrap.dedent(
    """
    from p2prl.rl.tasks import Problem, Task, seed_ints

    class DoubleTask(Task):
        name = "double"

        def __init__(self, limit: int = 50) -> None:
            if not 1 <= limit <= 1000:
                raise ValueError("limit must be in 1..1000")
            self.limit = limit

        def problem(self, seed):
            n = seed_ints(seed, 1)[0] % self.limit
            return Problem(prompt=f"2*{n}=", answer=str(2 * n))

        def reward(self, problem, completion):
            return 1.0 if completion == problem.answer else 0.0

    def not_a_task(**kw):
        return object()
    """
)


def install(root: Path, dist: str, module: str, source: str, entries: dict[str, str]) -> None:
    """A minimal installed distribution: the module plus its dist-info (METADATA, entry_points.txt)."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entries.items())
    (info / "entry_points.txt").write_text("[p2prl.tasks]\n" + lines)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_builtins_and_unknown_names() -> None:
    tasks = available_tasks()
    assert {"addition", "gsm8k", "countdown"} <= set(tasks)
    assert tasks["addition"] == "builtin"
    with pytest.raises(ValueError, match=r"unknown task 'chess'; known: addition, countdown, digit-start, gsm8k"):
        get_task("chess")


def test_pyproject_registers_the_builtins_where_they_are() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    entries = pyproject["project"]["entry-points"]["p2prl.tasks"]
    assert entries == {n: f"{c.__module__}:{c.__qualname__}" for n, c in BUILTIN_TASKS.items()}


def test_bad_params_name_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"'addition' takes no parameter digts; it takes: digits"):
        get_task("addition", digts=3)
    with pytest.raises(ValueError, match="digits must be an integer"):
        get_task("addition", digits=0)
    with pytest.raises(ValueError, match="takes: path, data_sha256, max_records"):
        get_task("gsm8k", file="x.jsonl")


def test_entry_point_plugin_is_found_and_built(plugin_dir: Path) -> None:
    assert "double" not in available_tasks()
    install(plugin_dir, "p2prl-double", "p2prl_double", PLUGIN, {"double": "p2prl_double:DoubleTask"})
    assert available_tasks()["double"] == "p2prl_double:DoubleTask"
    task = get_task("double", limit=10)
    p = task.problem(b"seed")
    assert p == get_task("double", limit=10).problem(b"seed")
    assert task.reward(p, p.answer) == 1.0 and task.reward(p, p.answer + "0") == 0.0
    with pytest.raises(ValueError, match="takes no parameter digits; it takes: limit"):
        get_task("double", digits=2)
    with pytest.raises(ValueError, match="limit must be in"):
        get_task("double", limit=0)
    with pytest.raises(ValueError, match=r"known: addition, countdown, digit-start, double, gsm8k"):
        get_task("triple")


def test_plugins_cannot_take_over_or_break_things(plugin_dir: Path) -> None:
    install(
        plugin_dir,
        "p2prl-evil",
        "p2prl_evil",
        PLUGIN,
        {"addition": "p2prl_evil:DoubleTask", "bogus": "p2prl_evil:not_a_task", "gone": "p2prl_missing:X"},
    )
    assert isinstance(get_task("addition"), AdditionTask)  # a built-in name stays the built-in
    assert available_tasks()["addition"] == "builtin"
    with pytest.raises(ValueError, match="returned object, not a p2prl Task"):
        get_task("bogus")
    with pytest.raises(ValueError, match=r"cannot load plugin p2prl_missing:X \(ModuleNotFoundError"):
        get_task("gone")
    # two distributions claiming one name: neither wins, so no two nodes can disagree on it
    install(plugin_dir, "p2prl-double", "p2prl_double", PLUGIN, {"double": "p2prl_double:DoubleTask"})
    install(plugin_dir, "p2prl-double2", "p2prl_double2", PLUGIN, {"double": "p2prl_double2:DoubleTask"})
    assert "double" not in available_tasks()
    with pytest.raises(ValueError, match="unknown task 'double'"):
        get_task("double")


def test_parse_task_params() -> None:
    assert parse_task_params(["digits=3", "path=d.jsonl", "use_all=true", "x=1.5", 's="7"']) == {
        "digits": 3,
        "path": "d.jsonl",
        "use_all": True,
        "x": 1.5,
        "s": "7",
    }
    assert parse_task_params([]) == {}
    for bad, why in [
        ("digits", "NAME=VALUE"),
        ("=3", "NAME=VALUE"),
        ("a=[1]", "only numbers"),
        ("a=1", None),
    ]:
        items = [bad] if why else ["a=1", bad]
        with pytest.raises(ValueError, match=why or "given twice"):
            parse_task_params(items)


def test_pin_task_params_pins_data_files(tmp_path: Path) -> None:
    assert pin_task_params("addition", {"digits": 3}) == {"digits": 3}
    f = tmp_path / "d.jsonl"
    f.write_text('{"question": "q", "answer": "#### 2"}\n')
    assert pin_task_params("gsm8k", {"path": str(f)}) == {"path": str(f), "data_sha256": file_sha256(f)}
    sample = pin_task_params("gsm8k", {})
    assert sample == {"data_sha256": get_task("gsm8k").data_sha256}
    with pytest.raises(ValueError, match="the genesis pins"):
        pin_task_params("gsm8k", {"path": str(f), "data_sha256": "00" * 32})
    with pytest.raises(ValueError, match="unknown task"):
        pin_task_params("chess", {})


def test_the_plugin_in_the_docs_is_the_example_package() -> None:
    """docs/TASKS.md shows examples/task-plugin verbatim (that package is what the node test installs)."""
    import re

    root = Path(__file__).parents[2]
    doc = (root / "docs" / "TASKS.md").read_text()
    blocks = re.findall(r"```(?:python)?\n(.*?)```", doc, flags=re.S)
    module = (root / "examples" / "task-plugin" / "p2prl_example_task.py").read_text()
    project = (root / "examples" / "task-plugin" / "pyproject.toml").read_text()
    code = module[module.index("from p2prl.rl.tasks import") :]
    assert code in blocks
    shown = next(b for b in blocks if b.startswith("[build-system]"))
    assert set(shown.splitlines()) <= set(project.splitlines())
    assert '[project.entry-points."p2prl.tasks"]' in shown
