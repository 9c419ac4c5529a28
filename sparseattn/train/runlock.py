"""One run per folder: an OS file lock on RUN_DIR/.lock, held while a run writes there.

The operating system releases the lock when the process ends however it ends (exit, exception,
kill -9), so a folder is never left locked by a dead run, and two runs started together cannot
both pass the check: the second `flock` fails at once. The lock file itself is never deleted
(deleting it would let two processes lock two different files of one name); it holds the pid of
the run that has it, for the message a refused run prints.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

LOCK_FILE = ".lock"


def make_run_dir(out: Path) -> None:
    """Create RUN_DIR (and its parents); ValueError naming --out when it cannot be a folder."""
    if out.is_symlink() and not out.exists():
        raise ValueError(f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)


def _try_lock(f: IO[str]) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def run_dir_lock(out: Path) -> Iterator[None]:
    """Hold RUN_DIR's lock for the body; ValueError in one line when another live process holds
    it (a run training there, or one resuming it)."""
    make_run_dir(out)
    path = out / LOCK_FILE
    f = open(path, "a+", encoding="utf-8")
    try:
        f.seek(0)
        if not _try_lock(f):
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise ValueError(
                f"--out {out} is in use by another run (pid {holder}) that is still writing to it; wait for it "
                "to finish (or stop it), or choose another --out"
            )
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing releases the lock


__all__ = ["run_dir_lock", "make_run_dir", "LOCK_FILE"]
