"""Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors. TRITON_INTERPRET is
read when the @triton.jit kernels are defined, so it is set here, before any test module of this
folder imports sparseattn.kernels.triton."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
