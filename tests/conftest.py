"""Fixtures shared by the test files."""

import os
import sys

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


@pytest.fixture(autouse=True, scope="session")
def command_line_of_no_command():
    """``sys.argv`` without pytest's own arguments, for the whole session (module fixtures run commands too): the
    tests give each command its arguments (``args=``), and LightningCLI warns when ``sys.argv`` holds others too (and
    reads them where a test passes none)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", sys.argv[:1])
        yield
