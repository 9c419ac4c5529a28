"""The benchmarks, one `Bench` line each: the results file names the renderer reads, the pages it
writes, their order in the index and their entries in mkdocs.yml's nav all follow from `BENCHES`.

A new benchmark is its script, `benchmarks/bench_<name>.py` (writing `bench_<name>_<machine>[_<variant>].json`
through `harness.Output`), and one line here; a renderer (`tables`, `headline` or `page`, in a module of
pages/) and a template (`benchmarks/templates/<name>.md`) are optional: without them its page shows the
line's title and each run's header, rows and other stored tables as they are (`generic.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from .common import Run
from .gpu_dist import distributed_headline, distributed_tables, page_triton_gpu
from .kernels import dgl_headline, dgl_table, page_kernels
from .models import layers_headline, layers_tables, page_compile, train_headline, train_table

# (runs, snippet) -> (the page's parts, its headline per machine): a page of its own layout
PageRenderer = Callable[[List[Run], Callable[[str], str]], Tuple[List[str], Dict[str, str]]]
NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")


@dataclass(frozen=True)
class Bench:
    """A benchmark: script `benchmarks/bench_<name>.py`, results `bench_<name>_<machine>[_<variant>]`,
    page `docs/benchmarks/<name>.md` under `title` in the nav (and in the index if it has no template).
    The page: `page(runs, snippet)` if given; else per machine a section, per run its header,
    `tables(run)` (default: `generic.run_tables`) and plot, and `headline(the machine's runs)` its
    line in the index (default: none; the index says "see the page")."""

    name: str
    title: str
    tables: Optional[Callable[[Run], List[str]]] = None
    headline: Optional[Callable[[List[Run]], str]] = None
    page: Optional[PageRenderer] = None

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name) or self.name == "index":
            raise ValueError(f"benchmark name {self.name!r}: lowercase words joined by '_', not index")
        if not self.title or "\n" in self.title:
            raise ValueError(f"benchmark {self.name!r}: a one-line title")


BENCHES: Tuple[Bench, ...] = (  # in the order of the index and the nav
    Bench("kernels", "Kernels", page=page_kernels),
    Bench("layers", "Layers", layers_tables, layers_headline),
    Bench("train", "Training step", train_table, train_headline),
    Bench("compile", "Compiled vs eager", page=page_compile),
    Bench("dgl", "DGL", dgl_table, dgl_headline),
    Bench("triton_gpu", "Triton (GPU)", page=page_triton_gpu),
    Bench("distributed", "Several processes", distributed_tables, distributed_headline),
)


def benches() -> Tuple[Bench, ...]:
    """The registry as it stands (read at each call, so a test may add a line), names checked unique."""
    names = [b.name for b in BENCHES]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"benchmarks registered twice: {twice}")
    return BENCHES


def names() -> Tuple[str, ...]:
    return tuple(b.name for b in benches())


def bench(name: str) -> Bench:
    """The registry line of a benchmark."""
    found = [b for b in benches() if b.name == name]
    if not found:
        raise KeyError(f"no benchmark {name!r} in benchmarks/pages/registry.py (known: {', '.join(names())})")
    return found[0]
