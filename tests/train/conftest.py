import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test with one torch thread, restoring the count after. These tests run many small
    ops; on a shared 2-core machine two OpenMP threads competing with other processes made them up
    to 100x slower (measured: a tiny UT forward 0.03 s with one thread, 0.8-3 s with two under load ~7)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
