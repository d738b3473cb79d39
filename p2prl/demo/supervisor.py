"""Starts and stops the processes of a local network: a moto S3 endpoint and one process per node.

Children run in their own sessions, so a terminal's Ctrl-C reaches only the supervisor, which then
stops them in order (SIGTERM, a grace period, SIGKILL for stragglers) and never leaves one behind.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from p2prl.net import free_port, public_read_policy

log = logging.getLogger(__name__)


def node_command(env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` that run ``python -m p2prl`` on the very package this process imported.

    ``python -m`` puts the working directory first on ``sys.path``: run from a clone's parent, the
    clone's folder (also named p2prl, no ``__init__.py``) became the package and every node died on
    ``cannot import name '__version__'``. ``-P`` leaves the working directory out, and a package
    imported from a source tree (an editable install, ``PYTHONPATH``) has that tree put first.
    """
    import site

    full = {**os.environ, **(env or {})}
    root = Path(__file__).resolve().parents[2]  # the folder holding this p2prl package
    sites = {Path(d).resolve() for d in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in sites:
        parts = [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p]
        full["PYTHONPATH"] = os.pathsep.join([str(root), *(p for p in parts if p != str(root))])
    return [sys.executable, "-P", "-m", "p2prl"], full


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def s3_missing() -> str | None:
    """Why the local S3 endpoint cannot run here (its server package is not importable), else None.

    moto and flask are runtime dependencies; an install made without them (``--no-deps``, a trimmed
    image) still runs a demo, peer to peer only.
    """
    try:
        import flask  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as e:
        return f"{e.name or e} is not installed"
    return None


class S3Server:
    """moto's S3 over real HTTP on 127.0.0.1 (boto3 talks to it over the wire like to any endpoint)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from moto.server import ThreadedMotoServer

        # werkzeug logs every request at INFO, which would scroll over the dashboard
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.host = host
        self.port = port or free_port(host)
        self._server = ThreadedMotoServer(ip_address=host, port=self.port, verbose=False)
        self._running = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> S3Server:
        self._server.start()
        self._running = True
        return self

    def create_bucket(self, bucket: str) -> None:
        import boto3

        client: Any = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=bucket)

        client.put_bucket_policy(Bucket=bucket, Policy=public_read_policy(bucket))  # nodes read unsigned

    def stop(self) -> None:
        if self._running:
            self._server.stop()
            self._running = False


class Supervisor:
    """Owns child processes; ``stop_all`` (also on context exit) ends every one of them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.children: list[Child] = []
        self.s3: S3Server | None = None

    def start_s3(self) -> S3Server:
        self.s3 = S3Server().start()
        return self.s3

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """Run ``python -m p2prl <args>`` with its output in ``<workdir>/logs/<name>.log``."""
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{name}.log"
        f = open(log_path, "ab")  # noqa: SIM115 (closed in stop_all)
        argv, full_env = node_command(env)
        proc = subprocess.Popen(
            [*argv, *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
        child = Child(name, proc, log_path, f)
        self.children.append(child)
        log.info("started %s (pid %d)", name, proc.pid)
        return child

    def get(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def signal(self, name: str, sig: int) -> None:
        c = self.get(name)
        if c.alive:
            c.proc.send_signal(sig)

    def stop_child(self, child: Child, grace_s: float = 20.0) -> int | None:
        if child.alive:
            child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", child.name, grace_s)
                child.proc.kill()
                child.proc.wait(timeout=10)
        child.log_file.close()
        return child.proc.returncode

    def stop_all(self, grace_s: float = 20.0) -> dict[str, int | None]:
        """SIGTERM every child at once, wait up to ``grace_s`` in all, then SIGKILL any left."""
        for c in self.children:
            if c.alive:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        codes: dict[str, int | None] = {}
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", c.name)
                c.proc.kill()
                c.proc.wait(timeout=10)
            if not c.log_file.closed:
                c.log_file.close()
            codes[c.name] = c.proc.returncode
        if self.s3 is not None:
            self.s3.stop()
        return codes

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
