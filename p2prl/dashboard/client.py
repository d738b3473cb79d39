"""The status client: what the dashboard, ``p2prl status`` and the demo read from a node's endpoint."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def fetch_status(url: str, timeout: float = 2.0) -> dict[str, Any]:
    """GET ``<url>/status`` and parse it (at most 8 MiB is read: an endpoint cannot make the reader hold more)."""
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as r:
        if r.status != 200:
            raise OSError(f"{url}: HTTP {r.status}")
        data = r.read(8 * 1024 * 1024)
    out = json.loads(data)
    if not isinstance(out, dict):
        raise ValueError(f"{url}: status is not an object")
    return out
