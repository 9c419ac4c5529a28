import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs with one torch thread (tests/conftest.py, `one_thread`)."""
