"""Models built on the public sparseattn surface."""
from .bilstm import BiLSTMTagger
from .tagger import TransformerTagger
from .tagging import Tagger, TokenFeatures

__all__ = ["BiLSTMTagger", "TransformerTagger", "Tagger", "TokenFeatures"]
