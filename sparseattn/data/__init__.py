"""Data: tasks (seeded letter tasks, multi30k translation and the task registry) and graph batching."""
from .batching import GraphBatch, GraphPool, bucket_batches, token_batches
from .tasks import TASKS, Seq2SeqTask, Task, Vocab, get_task, register_task
from . import translation_task  # noqa: F401  (registers "multi30k"; tokenizers is imported lazily)

__all__ = ["GraphBatch", "GraphPool", "bucket_batches", "token_batches", "TASKS", "Task", "Seq2SeqTask", "Vocab",
           "get_task", "register_task"]
