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


FIRST_CALL = """
import sys
import torch
from sparseattn import EdgeAttention, edge_attention, graphs
g = graphs.window(200, radius=4)
q = torch.randn(200, 2, 8, requires_grad=True)
edge_attention(q, q, q, g, clamp=None).sum().backward()
edge_attention(q, q, q, torch.randint(0, 200, (2, 900)), return_weights=True)[1].sum().backward()
with torch.no_grad():
    EdgeAttention(16, 2)(torch.randn(200, 16), g)
print("torch._dynamo" in sys.modules)
"""


def test_eager_calls_do_not_import_the_compiler():
    """Eager attention runs the kernels' Python directly, not through the custom ops' dispatcher,
    whose first call imports torch._dynamo: about 1 s of a fresh process's first call (the
    first-call target of issue 44 is 0.3 s after `import torch`)."""
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", out
