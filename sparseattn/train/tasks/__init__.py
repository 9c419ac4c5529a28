"""The tasks `sparseattn train --task NAME` knows: letters (copy, sort, reverse), multi30k,
chunking; `register_task` adds one (see base.py)."""

from . import chunking, letters, multi30k  # noqa: F401  (each registers its tasks)
from .base import TASKS, Seq2SeqTask, Task, get_task, register_task

__all__ = ["TASKS", "Task", "Seq2SeqTask", "get_task", "register_task"]
