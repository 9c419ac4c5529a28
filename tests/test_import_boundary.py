"""The library never imports the application: `import sparseattn, sparseattn.models` loads no module
of sparseattn.train and none of the application's dependencies."""

import subprocess
import sys

APP_DEPENDENCIES = ("tqdm", "matplotlib", "tokenizers", "sacrebleu", "seqeval")

# torch may pull some of these in itself (torch 2.13 imports tqdm), so only what importing the
# library adds on top of `import torch, numpy` counts
PROBE = f"""
import sys
import numpy, torch
before = set(sys.modules)
import sparseattn, sparseattn.models
added = set(sys.modules) - before
app = sorted(m for m in added if m == "sparseattn.train" or m.startswith("sparseattn.train."))
deps = sorted(m for m in added if m.split(".")[0] in {APP_DEPENDENCIES!r})
print(app, deps)
"""


def test_library_imports_no_application_module():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []", out
