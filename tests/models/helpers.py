"""Small seq2seq batches and models shared by the model tests."""

import torch

from sparseattn.models import GraphPool, GraphTransformer, UniversalTransformer

V = 12  # vocabulary: 0 unk, 1 bos, 2 eos, 3.. tokens
BOS, EOS = 1, 2


def random_pairs(num, seed=0, lo=1, hi=9):
    gen = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(num):
        n = int(torch.randint(lo, hi, (1,), generator=gen))
        m = int(torch.randint(lo, hi, (1,), generator=gen))
        src.append(torch.randint(3, V, (n,), generator=gen).tolist())
        tgt.append(torch.randint(3, V, (m,), generator=gen).tolist())
    return src, tgt


def make_batch(num=4, seed=0):
    src, tgt = random_pairs(num, seed)
    return GraphPool().batch(src, tgt, bos=BOS, eos=EOS)


def make_model(kind, dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    common = dict(d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    common.update(kw)
    if kind == "transformer":
        model = GraphTransformer(V, V, num_layers=2, **common)
    else:
        model = UniversalTransformer(V, V, max_steps=4, **common)
    return model.to(dtype).eval()
