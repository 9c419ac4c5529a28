"""Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors. Triton reads
TRITON_INTERPRET when `triton.language` and the @triton.jit kernels are defined, so it is set here,
before any test module (or a backend probe at collection) imports triton."""

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from sparseattn.kernels import Backend, register_backend  # noqa: E402
from sparseattn.kernels.csr import csr_attention  # noqa: E402


# csr picks its layout per graph (head-major only on large graphs without locality, which the
# tests' small graphs never are); registered under its own name, every backend test runs it too.
def _csr_head_major(inputs):
    return csr_attention(inputs._replace(options=dataclasses.replace(inputs.options, csr_layout="head-major")))


register_backend(Backend("csr-head-major", _csr_head_major, devices=("cpu",)))

settings.register_profile(
    "default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "thorough",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture
def one_thread():
    """One torch thread for the test, restoring the count after; tests/models and tests/train use
    it for every test. Those run many small ops; on a shared 2-core machine two OpenMP threads
    competing with other processes made them up to 100x slower (measured: a tiny UT forward 0.03 s
    with one thread, 0.8-3 s with two under load ~7)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def head_major_calls(monkeypatch):
    """A list that gets one entry per call of csr's head-major forward (the layout csr took)."""
    from sparseattn.kernels.csr import head_major

    calls: list = []
    forward = head_major.forward
    monkeypatch.setattr(head_major, "forward", lambda *a: calls.append(1) or forward(*a))
    return calls


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
