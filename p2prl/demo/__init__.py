"""``p2prl demo``: a whole network on 127.0.0.1 (local S3, trainer, validator, miners), one process per
node, started and stopped by a supervisor. It only launches ``p2prl node`` processes and reads their
status endpoints; it imports no role. ``p2prl bench scale`` (``scale.py``) runs such a network on a
Qwen2.5-0.5B-shaped model and reads per-version costs from the same endpoints."""

from p2prl.demo.launcher import DemoOptions, progress_line, run_demo, summarize
from p2prl.demo.scale import ScaleOptions, run_scale_bench
from p2prl.demo.supervisor import S3Server, Supervisor, s3_missing
from p2prl.demo.testbed import run_demo_testbed

__all__ = [
    "DemoOptions",
    "S3Server",
    "ScaleOptions",
    "Supervisor",
    "progress_line",
    "run_demo",
    "run_demo_testbed",
    "run_scale_bench",
    "s3_missing",
    "summarize",
]
