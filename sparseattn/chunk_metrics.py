"""Chunking scores with seqeval: conlleval-compatible chunk precision/recall/F1 over IOB2 tags.

seqeval's default mode reproduces conlleval: a chunk is a maximal run B-X I-X ...; an I-X that
does not continue an X chunk starts a new one. Scores are percentages of whole chunks.
"""
from __future__ import annotations

from typing import Dict, List, Sequence


def _seqeval():
    try:
        from seqeval import metrics
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("chunk metrics need seqeval: pip install 'sparseattn[tagging]'") from e
    return metrics


def _check(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} sentences but pred has {len(pred)}")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: gold has {len(g)} tags but pred has {len(p)}")


def chunk_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Overall chunk F1 in [0, 1] (micro average over chunk types)."""
    _check(gold, pred)
    return float(_seqeval().f1_score([list(s) for s in gold], [list(s) for s in pred]))


def chunk_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict[str, Dict[str, float]]:
    """{"overall" | chunk type: {"precision", "recall", "f1", "support"}}; scores in [0, 1]."""
    _check(gold, pred)
    gold_l: List[List[str]] = [list(s) for s in gold]
    pred_l: List[List[str]] = [list(s) for s in pred]
    report = _seqeval().classification_report(gold_l, pred_l, output_dict=True, zero_division=0)
    scores = {name: {"precision": float(r["precision"]), "recall": float(r["recall"]),
                     "f1": float(r["f1-score"]), "support": int(r["support"])}
              for name, r in report.items() if not name.endswith(" avg")}
    micro = report["micro avg"]
    scores["overall"] = {"precision": float(micro["precision"]), "recall": float(micro["recall"]),
                         "f1": float(micro["f1-score"]), "support": int(micro["support"])}
    return scores


def format_scores(scores: Dict[str, Dict[str, float]]) -> str:
    """A conlleval-like table: overall first, then chunk types by support."""
    lines = [f"{'chunk':<8} {'precision':>9} {'recall':>7} {'F1':>7} {'support':>8}"]
    names = ["overall"] + sorted((n for n in scores if n != "overall"), key=lambda n: -scores[n]["support"])
    for n in names:
        s = scores[n]
        lines.append(f"{n:<8} {100 * s['precision']:>9.2f} {100 * s['recall']:>7.2f} {100 * s['f1']:>7.2f} "
                     f"{s['support']:>8d}")
    return "\n".join(lines)
