"""A callback that ends one rank of a run mid-epoch, as a machine does: ``kill -9`` of itself, or an exception.

Used by ``tests/runs/test_dead_rank.py`` and ``benchmarks/dead_rank.py`` through ``--trainer.callbacks+=dying.Die``
(the folder of this file on ``PYTHONPATH``, so that every rank the launcher starts imports it).
"""

import os
import signal
import time
from typing import Literal

from lightning.pytorch import Callback


class Die(Callback):
    """End global rank ``rank`` after its training batch ``batch`` of epoch ``epoch``; it prints when (Unix time).

    Args:
        rank: the global rank that dies.
        batch: the batch index after which it dies.
        epoch: the epoch in which it dies.
        how: ``kill`` (SIGKILL of its own process, as the OOM killer or ``kill -9``), ``raise`` (an exception on
            that rank only) or ``stop`` (SIGSTOP: alive but silent, as a hung rank).
    """

    def __init__(
        self, rank: int = 1, batch: int = 1, epoch: int = 0, how: Literal["kill", "raise", "stop"] = "kill"
    ) -> None:
        self.rank, self.batch, self.epoch, self.how = rank, batch, epoch, how

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank != self.rank or batch_idx != self.batch or trainer.current_epoch != self.epoch:
            return
        print(f"dying: rank {self.rank} (pid {os.getpid()}) ends now ({self.how}) at {time.time():.3f}", flush=True)
        if self.how != "raise":
            os.kill(os.getpid(), signal.SIGKILL if self.how == "kill" else signal.SIGSTOP)
        raise RuntimeError(f"rank {self.rank} failed on purpose")
