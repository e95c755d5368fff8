"""The line a process says when a collective lost a peer: which errors count, and how a rank's end is told.

The processes themselves are killed in ``tests/runs/test_dead_rank.py``; here, the errors as gloo raised them there.
"""

import pytest

from layerwise.cli.peers import how_it_ended, is_lost_peer

RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:2208: Connection "
    "reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)


@pytest.mark.parametrize(
    "error, lost",
    [
        (RuntimeError(RESET), True),  # a dead peer: at once
        (RuntimeError("Application timeout caused pair closure"), True),  # a hung peer, after the timeout
        (RuntimeError("rank 1 failed on purpose"), False),  # this rank's own failure
        (RuntimeError("HTTPSConnectionPool: Connection reset by peer"), False),  # not a collective (a logger's upload)
        (ValueError("returned nan values"), False),
    ],
)
def test_only_a_collective_that_lost_its_peer_counts(error, lost):
    assert is_lost_peer(error) is lost


def test_a_ranks_end_is_told_by_its_signal_or_exit_code():
    assert how_it_ended(-9) == "killed by signal 9 (SIGKILL)"
    assert how_it_ended(-15) == "killed by signal 15 (SIGTERM)"
    assert how_it_ended(1) == "exited with code 1"
