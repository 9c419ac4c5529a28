"""Datasets read from local files or generated from a seed; nothing is downloaded."""
from .conll import Sentence, TaggingBatch, TaggingVocab, batches, encode, read_conll, split_dev

__all__ = ["Sentence", "TaggingBatch", "TaggingVocab", "batches", "encode", "read_conll", "split_dev"]
