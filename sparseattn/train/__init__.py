"""The application: training our models on sparseattn's public API.

cli.py (the `sparseattn` command), config.py (typed configs and presets), model_configs.py (the
models and their configs), trainer.py (the loop), checkpoint.py, distributed.py, ema.py,
metrics.py, plots.py, vocab.py, and tasks/ (letters, multi30k, chunking). Nothing in the library
(`sparseattn`, `sparseattn.models`) imports from here.
"""

from . import model_configs, tasks  # noqa: E402,F401  (register the built-in models and tasks)
