"""Finding tasks by name: the built-ins, plus every entry point in the group ``p2prl.tasks``.

``pip install my-env`` adds a task when ``my-env`` declares ``[project.entry-points."p2prl.tasks"]
my-task = "my_env:MyTask"``. The entry point names a ``Task`` subclass (or a callable that takes the
task's parameters as keywords and returns a ``Task``). Built-in names cannot be taken over by a plugin:
a genesis that says ``addition`` means the same task on every machine.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from p2prl.rl.tasks.addition import AdditionTask
from p2prl.rl.tasks.base import Task
from p2prl.rl.tasks.countdown import CountdownTask
from p2prl.rl.tasks.data import DataTask
from p2prl.rl.tasks.digitstart import DigitStartTask
from p2prl.rl.tasks.gsm8k import GSM8KTask

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "p2prl.tasks"
DEFAULT_TASK = "addition"
BUILTIN_TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "gsm8k": GSM8KTask,
    "countdown": CountdownTask,
    "digit-start": DigitStartTask,
}
TaskFactory = Callable[..., Task]


def _plugins() -> dict[str, EntryPoint]:
    """Entry points of ``p2prl.tasks`` on the current ``sys.path`` (read afresh: cheap, and a plugin
    installed after start-up is seen). A built-in name or a name two distributions claim is skipped."""
    found: dict[str, EntryPoint] = {}
    clashes: set[str] = set()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN_TASKS:
            if ep.dist is None or ep.dist.name != "p2prl":  # p2prl's own registration of its built-ins
                log.warning("task plugin %r (%s) ignored: a built-in task has that name", ep.name, ep.value)
            continue
        if ep.name in found and found[ep.name].value != ep.value:
            clashes.add(ep.name)
        found.setdefault(ep.name, ep)
    for name in clashes:
        log.warning("task plugin %r ignored: more than one package registers it", name)
        del found[name]
    return found


def available_tasks() -> dict[str, str]:
    """Every task name this machine can build, with where it comes from (``builtin`` or ``module:attr``)."""
    out = dict.fromkeys(BUILTIN_TASKS, "builtin")
    out.update({name: ep.value for name, ep in _plugins().items()})
    return dict(sorted(out.items()))


def _factory(name: str) -> TaskFactory:
    if name in BUILTIN_TASKS:
        return BUILTIN_TASKS[name]
    ep = _plugins().get(name)
    if ep is None:
        known = ", ".join(available_tasks())
        raise ValueError(
            f"unknown task {name!r}; known: {known} (a plugin task is found through the "
            f"{ENTRY_POINT_GROUP!r} entry-point group of an installed package)"
        )
    try:
        obj = ep.load()
    except Exception as e:  # a broken plugin is a clear start-up error, not a traceback
        raise ValueError(f"task {name!r}: cannot load plugin {ep.value} ({type(e).__name__}: {e})") from e
    if not callable(obj):
        raise ValueError(f"task {name!r}: plugin {ep.value} is not a Task class or factory")
    return obj


def _check_params(name: str, factory: TaskFactory, params: Mapping[str, Any]) -> None:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    ps = [p for p in sig.parameters.values() if p.name != "self"]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps):
        return
    takes = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(params) - set(takes))
    if unknown:
        raise ValueError(
            f"task {name!r} takes no parameter {', '.join(unknown)}; it takes: {', '.join(takes) or 'none'}"
        )


def get_task(name: str, **params: Any) -> Task:
    """The task registered under ``name``, built with ``params`` (e.g. ``digits=3``; data-backed tasks:
    ``path=FILE, data_sha256=HEX``). Raises ``ValueError`` naming the known tasks or the accepted
    parameters on a bad name or bad parameters."""
    factory = _factory(name)
    _check_params(name, factory, params)
    try:
        task = factory(**params)
    except TypeError as e:
        raise ValueError(f"task {name!r}: bad parameters {sorted(params)} ({e})") from e
    if not isinstance(task, Task):
        raise ValueError(f"task {name!r}: its plugin returned {type(task).__name__}, not a p2prl Task")
    return task


def pin_task_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a genesis pins them: a data-backed task gets ``data_sha256`` of its file (or of its
    packaged sample) when it was not given; then the task is built once to check it all."""
    out = dict(params)
    factory = _factory(name)
    if isinstance(factory, type) and issubclass(factory, DataTask) and out.get("data_sha256") is None:
        out["data_sha256"] = factory.pinned_sha256(out.get("path"))
    get_task(name, **out)
    return out


def parse_task_params(items: Iterable[str]) -> dict[str, Any]:
    """``["digits=3", "path=d.jsonl", "use_all=true"]`` → ``{"digits": 3, "path": "d.jsonl",
    "use_all": True}``: a value that parses as JSON is taken as JSON, anything else as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"task parameter {item!r} is not NAME=VALUE")
        if key in out:
            raise ValueError(f"task parameter {key!r} given twice")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, (dict, list)) or (isinstance(value, float) and value != value):
            raise ValueError(f"task parameter {key!r}: only numbers, strings, true/false and null")
        out[key] = value
    return out
