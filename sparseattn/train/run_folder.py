"""What a new run does to the run folder it trains in: refuse one that holds a run (unless
--overwrite), replace that run only once the new one has started, and tell one run's files from
another's.

An --overwrite run sets up (data, device, vocabulary, model) and trains in RUN_DIR/.new-run/
while RUN_DIR keeps the old run. It has started, and takes RUN_DIR's place, at its first checkpoint
that ends an epoch or the run (the first epoch's end, a time budget's cut-short epoch, max_steps);
checkpoint_every's checkpoints before that stay in .new-run/. A start that fails or is interrupted
before that (a missing data file, no CUDA, a NaN loss, Ctrl-C or SIGTERM, also one that comes
during the first validation) removes .new-run/ and leaves the old run as it was: an interrupt never
replaces a run.

The swap is one atomic step: .new-run/ gets the list of its files (SWAP_LIST), then is renamed to
.swapping/. Before that rename RUN_DIR holds the old run; after it, the new one: moving its files
in and deleting the old run's others finishes the swap, and a swap a killed process left half done
is finished (`finish_swap`) by the next command that takes the folder's lock (train, --resume,
evaluate, plot, translate) before it reads anything. The folder's lock (runlock.py) covers both
folders: one run at a time writes in either.

Every file of a run carries its run id (RUN_ID: a key of checkpoint.pt, best.pt, config.json and
results.json, and of each metrics.jsonl record): `check_one_run` refuses a folder whose files name
different runs (files copied together by hand, or a swap of an older version killed halfway).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Dict, List, Optional

from . import checkpoint as ckpt_io

RUN_FILES = ("checkpoint.pt", "best.pt", "metrics.jsonl", "config.json", "results.json", "tokenizer.json")
STAGING = ".new-run"
SWAPPING = ".swapping"
SWAP_LIST = "files.json"  # in .swapping/: the new run's files, relative to RUN_DIR
RUN_ID = "run_id"


def new_run_id() -> str:
    """A fresh run id (random: it draws from none of the RNGs a resumed run must replay)."""
    return uuid.uuid4().hex[:12]


def staging_dir(out: Path) -> Path:
    """Where an --overwrite run into `out` sets up and trains until it has started."""
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
    """Replace the run in `out` with the one set up in `staging`: list its files, rename `staging`
    to `out`/.swapping (the one step that decides which run `out` holds), then `finish_swap`."""
    new = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
    with open(staging / SWAP_LIST, "w", encoding="utf-8") as f:
        json.dump(new, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, out / SWAPPING)
    finish_swap(out)


def finish_swap(out: Path) -> bool:
    """Finish a swap `out`/.swapping holds (one under way, or one a killed process left): delete the
    old run's files the new run lacks, move the new run's in (checkpoint.pt, which a resume reads,
    last), remove .swapping. Each step can be repeated, so a kill at any point is finished by the
    next call. False when there is no swap to finish. Call it holding the folder's lock."""
    swapping = out / SWAPPING
    if not swapping.is_dir():
        return False
    try:
        new = json.loads((swapping / SWAP_LIST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ValueError(
            f"{swapping} holds a run being swapped into {out} but not the list of its files; move its files "
            f"into {out} by hand, or delete it to keep the run {out} holds"
        ) from None
    for old in run_files(out):
        if str(old.relative_to(out)) not in new:
            old.unlink(missing_ok=True)
    for rel in sorted(new, key=lambda name: name == RUN_FILES[0]):
        if (swapping / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(swapping / rel, out / rel)
    shutil.rmtree(swapping, ignore_errors=True)
    return True


def settle(out: Path) -> None:
    """Clear up what a killed run left in `out` (call it holding the folder's lock): a swap it had
    begun is finished, with a line on stderr, so the folder holds the new run; an --overwrite start
    that had not begun one is removed, so the folder keeps the old run."""
    if finish_swap(out):
        print(f"{out}: finished swapping in the --overwrite run that a killed process left half moved", file=sys.stderr)
    remove_staging(out)


def run_ids(out: Path) -> Dict[str, List[str]]:
    """{file name: the run ids it names} of the run files in `out` that name one (files written before
    run ids existed name none)."""
    found: Dict[str, List[str]] = {}
    for name in ("checkpoint.pt", "best.pt"):
        if (out / name).is_file():
            found[name] = [ckpt_io.peek(out / name, RUN_ID)]
    for name in ("config.json", "results.json"):
        if (out / name).is_file():
            try:
                found[name] = [json.loads((out / name).read_text(encoding="utf-8")).get(RUN_ID)]
            except (ValueError, AttributeError):  # not a JSON object: the file's own reader says so
                pass
    if (out / "metrics.jsonl").is_file():
        found["metrics.jsonl"] = [_record_id(line) for line in (out / "metrics.jsonl").read_bytes().splitlines()]
    return {name: sorted({i for i in ids if isinstance(i, str)}) for name, ids in found.items() if any(ids)}


def _record_id(line: bytes) -> Optional[str]:
    """The run id of one metrics.jsonl line (None for a torn or foreign line: read_metrics judges those)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get(RUN_ID) if isinstance(record, dict) else None


def check_one_run(out: Path) -> Optional[str]:
    """The run id the files of `out` share (None when none names one); a ValueError in one line when
    they name different runs."""
    ids = run_ids(out)
    every = sorted({i for names in ids.values() for i in names})
    if len(every) > 1:
        whose = "; ".join(f"{', '.join(n for n in ids if i in ids[n])} of run {i}" for i in every)
        raise ValueError(
            f"{out} mixes the files of {len(every)} runs ({whose}): they do not belong together, so nothing "
            "there is used; keep one run's files, or start again with --overwrite"
        )
    return every[0] if every else None


__all__ = [
    "RUN_FILES",
    "RUN_ID",
    "STAGING",
    "SWAPPING",
    "check_one_run",
    "check_run_dir",
    "finish_swap",
    "new_run_id",
    "remove_staging",
    "run_files",
    "run_ids",
    "settle",
    "staging_dir",
    "swap_in",
]
