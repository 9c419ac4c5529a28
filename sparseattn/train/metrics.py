"""Metrics of decoded sequences and running sums for training logs.

token_accuracy: matching positions / max(len(prediction), len(reference)) summed over the
corpus, so missing and extra tokens both count as errors; sequence_accuracy: exact matches.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Union

import numpy as np


def token_accuracy(predictions: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> float:
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    correct = total = 0
    for p, r in zip(predictions, references):
        correct += sum(a == b for a, b in zip(p, r))
        total += max(len(p), len(r))
    return correct / total if total else 1.0


def sequence_accuracy(predictions: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> float:
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    if not references:
        return 1.0
    return sum(list(p) == list(r) for p, r in zip(predictions, references)) / len(references)


class Meter:
    """Sums of the per-batch stats a task's loss returns (numbers or numpy arrays), and a clock.
    Conventional keys: loss (summed over tokens), tokens, correct."""

    def __init__(self) -> None:
        self.sums: Dict[str, object] = {}
        self.start = time.perf_counter()

    def add(self, stats: Dict[str, object]) -> None:
        for key, value in stats.items():
            self.sums[key] = self.sums[key] + value if key in self.sums else value

    @property
    def tokens(self) -> float:
        return float(self.sums.get("tokens", 0))

    def summary(self) -> Dict[str, object]:
        """loss and accuracy per token, tokens/s, and the other sums (arrays as lists)."""
        tokens = max(self.tokens, 1.0)
        elapsed = time.perf_counter() - self.start
        out: Dict[str, object] = {}
        for key, value in self.sums.items():
            if key == "loss":
                out["loss"] = float(value) / tokens
            elif key == "correct":
                out["accuracy"] = float(value) / tokens
            elif isinstance(value, np.ndarray):
                out[key] = value.tolist()
            else:
                out[key] = float(value)
        out["tokens_per_s"] = self.tokens / elapsed if elapsed > 0 else 0.0
        return out


def read_metrics(path: Union[str, Path]) -> List[dict]:
    """The records of a metrics.jsonl. A torn last line (a process killed while writing it) is
    skipped with a warning naming the file; a bad line before the last is a ValueError naming it."""
    path = Path(path)
    lines = path.read_bytes().splitlines()
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if number < len(lines):
                why = e.msg if isinstance(e, json.JSONDecodeError) else f"not UTF-8 text: {e.reason} at byte {e.start}"
                raise ValueError(f"{path}:{number} is not a JSON record ({why})") from None
            print(
                f"warning: {path}:{number}: skipping a torn last line (the run was killed while writing it)",
                file=sys.stderr,
            )
    return records
