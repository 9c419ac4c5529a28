"""Score terms computed outside the attention kernels and handed to `edge_attention` as its per-edge
`bias`: GATv2's additive score (gatv2.py), whose per-edge (H, C) pre-activation is never stored.
(GAT's score is a sum of per-node logits, cheap as it is: `sparseattn.nn.GATConv` builds it inline.)"""

from .gatv2 import (
    CHUNK_VALUES,
    UNCHUNKED_VALUES,
    default_chunk,
    gatv2_edge_scores,
    gatv2_scores,
    gatv2_scores_reference,
)

__all__ = [
    "CHUNK_VALUES",
    "UNCHUNKED_VALUES",
    "default_chunk",
    "gatv2_edge_scores",
    "gatv2_scores",
    "gatv2_scores_reference",
]
