"""Code blocks of the Markdown pages (README.md, docs/): extracted as they stand and run one by one,
each in a fresh interpreter, so a block that leans on an earlier one fails.

A ```python block preceded by the comment line `<!-- docs-test: skip (reason) -->` is not run
(the reason says which test covers it instead)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from tests.optional import OPTIONAL, module_missing

ROOT = Path(__file__).resolve().parent.parent
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]*)\)\s*-->")
FENCE = re.compile(r"^```(?P<info>\S*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: Optional[str]  # the reason of a docs-test: skip marker on the line before, or None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path, lang: Optional[str] = None) -> List[Block]:
    """The fenced code blocks of a Markdown file, in order (of one language if `lang` is given)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, info = i, m.group("info")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        assert end is not None, f"{path}:{start + 1}: code fence never closed"
        before = lines[start - 1] if start else ""
        marker = SKIP.search(before)
        code = "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(path, start + 1, info, code, marker["reason"] if marker else None))
        i = end + 1
    return [b for b in found if lang is None or b.lang == lang]


def run_python(block: Block, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run one block as a script in a fresh interpreter, from `cwd` (files it writes land there)."""
    script = cwd / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    env["MPLBACKEND"] = "Agg"
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def missing_optional(stderr: str) -> Optional[str]:
    """Why a failed block could not run, when what stopped it is a ModuleNotFoundError of an optional
    package (tests/optional.py's OPTIONAL) that is not installed here; else None, and the block's
    failure stands: a misspelled import, sparseattn's own modules, or a missing submodule of an
    installed package are errors in the docs, never a skip."""
    found = re.findall(r"ModuleNotFoundError: No module named '([^'.]+)", stderr)
    return module_missing(found[-1]) if found and found[-1] in OPTIONAL else None
