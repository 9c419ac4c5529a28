"""Data: tasks (seeded letter tasks, CoNLL-2000 chunking, the task registry) and graph batching."""
from .batching import GraphBatch, GraphPool, bucket_batches
from .conll import Sentence, TaggingBatch, TaggingVocab, batches, encode, read_conll, split_dev
from .tasks import TASKS, Seq2SeqTask, Task, Vocab, get_task, register_task
from . import chunking  # noqa: E402,F401  registers the "chunking" task

__all__ = ["GraphBatch", "GraphPool", "bucket_batches", "TASKS", "Task", "Seq2SeqTask", "Vocab", "get_task",
           "register_task", "Sentence", "TaggingBatch", "TaggingVocab", "batches", "encode", "read_conll", "split_dev"]
