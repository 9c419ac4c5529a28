"""What a new run does to the run folder it trains in: refuse one that holds a run (unless
--overwrite), and replace that run only once the new one has started.

An --overwrite run sets up (data, device, vocabulary, model) and trains in RUN_DIR/.new-run/
while RUN_DIR keeps the old run; its first checkpoint (an epoch end, checkpoint_every, max_steps,
Ctrl-C) swaps it in: the old run's files are removed and the new run's moved into RUN_DIR, each
file with one rename. A start that fails or is interrupted before that (a missing data file, no
CUDA, a NaN loss in the first steps) removes .new-run/ and leaves the old run as it was. The
folder's lock (runlock.py) covers .new-run/: one run at a time writes in either.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

RUN_FILES = ("checkpoint.pt", "best.pt", "metrics.jsonl", "config.json", "results.json", "tokenizer.json")
STAGING = ".new-run"


def staging_dir(out: Path) -> Path:
    """Where an --overwrite run into `out` sets up and trains until its first checkpoint."""
    return out / STAGING


def check_run_dir(out: Path, overwrite: bool) -> None:
    """ValueError naming --out when `out` holds a run and `overwrite` is false; removes nothing."""
    found = [name for name in RUN_FILES if (out / name).exists()]
    if found and not overwrite:
        raise ValueError(
            f"--out {out} already holds a run ({', '.join(found)}): continue it with --resume, or "
            "replace it with --overwrite"
        )


def run_files(out: Path) -> List[Path]:
    """The files of the run `out` holds, which a new run replaces: RUN_FILES, the temporary files of
    their writes (`*.tmp`), hypotheses and plots; never other files of the user's."""
    found = [out / name for name in RUN_FILES if (out / name).exists()]
    temps = [path for name in RUN_FILES for path in out.glob(f"{name}.*tmp")]  # save_atomic's and the tokenizer's
    return [*found, *temps, *out.glob("hyp.*.de"), *(out / "plots").glob("*.png")]


def remove_staging(out: Path) -> None:
    """Delete what an --overwrite start left in `out`'s staging folder (a failed or killed start)."""
    shutil.rmtree(staging_dir(out), ignore_errors=True)


def swap_in(staging: Path, out: Path) -> None:
    """Replace the run in `out` with the one set up in `staging`, then remove `staging`. The old
    run's files go first, so the folder never mixes the two runs' best.pt, results or plots;
    checkpoint.pt, which a resume reads, is moved last."""
    new = sorted(
        (p.relative_to(staging) for p in staging.rglob("*") if p.is_file()), key=lambda p: p.name == RUN_FILES[0]
    )
    for old in run_files(out):
        if old.relative_to(out) not in new:
            old.unlink(missing_ok=True)
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, out / rel)
    shutil.rmtree(staging, ignore_errors=True)


__all__ = ["RUN_FILES", "STAGING", "check_run_dir", "remove_staging", "run_files", "staging_dir", "swap_in"]
