"""Fixtures shared by the test files."""

import os

import pytest
import torch


@pytest.fixture
def single_thread():
    """One intra-op thread in the parent (inherited by forked children); environment and threads restored after."""
    environment, threads = dict(os.environ), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = "1"  # keeps Lightning from raising the children's thread count again
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(environment)
