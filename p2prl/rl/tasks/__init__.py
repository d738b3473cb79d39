"""Tasks with verifiable rewards: the problem comes from a public seed, the reward from the text alone.

The interface (``Task``, ``Problem``, ``seed_ints``) is for third parties too: a package adds a task
through the ``p2prl.tasks`` entry-point group (docs/TASKS.md). ``get_task(name, **params)`` is the one
way to build a task.
"""

from p2prl.rl.tasks.addition import AdditionTask
from p2prl.rl.tasks.base import Problem, Task, derive_seed, seed_ints
from p2prl.rl.tasks.countdown import CountdownTask
from p2prl.rl.tasks.data import DataTask, file_sha256
from p2prl.rl.tasks.gsm8k import GSM8KTask, parse_final_answer
from p2prl.rl.tasks.registry import (
    BUILTIN_TASKS,
    DEFAULT_TASK,
    ENTRY_POINT_GROUP,
    available_tasks,
    get_task,
    parse_task_params,
    pin_task_params,
)

__all__ = [
    "BUILTIN_TASKS",
    "DEFAULT_TASK",
    "ENTRY_POINT_GROUP",
    "AdditionTask",
    "CountdownTask",
    "DataTask",
    "GSM8KTask",
    "Problem",
    "Task",
    "available_tasks",
    "derive_seed",
    "file_sha256",
    "get_task",
    "parse_final_answer",
    "parse_task_params",
    "pin_task_params",
    "seed_ints",
]
