"""``p2prl demo``: a whole network on 127.0.0.1 (local S3, trainer, validator, miners), one process per
node, started and stopped by a supervisor. It only launches ``p2prl node`` processes and reads their
status endpoints; it imports no role."""

from p2prl.demo.launcher import DemoOptions, progress_line, run_demo, summarize
from p2prl.demo.supervisor import S3Server, Supervisor, s3_missing
from p2prl.demo.testbed import run_demo_testbed

__all__ = [
    "DemoOptions",
    "S3Server",
    "Supervisor",
    "progress_line",
    "run_demo",
    "run_demo_testbed",
    "s3_missing",
    "summarize",
]
