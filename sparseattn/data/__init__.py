"""Data: tasks (seeded letter tasks, CoNLL-2000 chunking, multi30k translation, the task registry)
and graph batching."""
from .batching import GraphBatch, GraphPool, bucket_batches, token_batches
from .conll import Sentence, TaggingBatch, TaggingVocab, encode, read_conll, split_dev
from .tasks import TASKS, Seq2SeqTask, Task, Vocab, get_task, register_task
from . import chunking  # noqa: E402,F401  registers the "chunking" task
from . import translation_task  # noqa: E402,F401  registers "multi30k" (tokenizers is imported lazily)

__all__ = ["GraphBatch", "GraphPool", "bucket_batches", "token_batches", "TASKS", "Task", "Seq2SeqTask", "Vocab",
           "get_task", "register_task", "Sentence", "TaggingBatch", "TaggingVocab", "encode", "read_conll",
           "split_dev"]
