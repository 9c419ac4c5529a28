"""Data: tasks (seeded letter tasks and the task registry) and graph batching."""
from .batching import GraphBatch, GraphPool, bucket_batches
from .tasks import TASKS, Seq2SeqTask, Task, Vocab, get_task, register_task

__all__ = ["GraphBatch", "GraphPool", "bucket_batches", "TASKS", "Task", "Seq2SeqTask", "Vocab", "get_task",
           "register_task"]
