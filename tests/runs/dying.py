"""A callback that ends one rank of a run mid-epoch, as a machine does: ``kill -9`` of itself, or an exception.

Used by ``tests/runs/test_dead_rank.py`` and ``benchmarks/dead_rank.py`` through ``--trainer.callbacks+=dying.Die``
(the folder of this file on ``PYTHONPATH``, so that every rank the launcher starts imports it).
"""

import os
import signal
import sys
import time
from pathlib import Path
from typing import Literal

from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[2]
# The rank's own line (stdout), with its pid and the Unix time it dies at.
DIES = r"^dying: rank 1 \(pid (\d+)\) ends now \(\w+\) at ([\d.]+)$"


def dying_fit(how: str, timeout: str) -> list[str]:
    """The command of a 2-process DDP fit (the quickstart cut to a 2-block 16-wide ViT) whose rank 1 dies ``how`` in
    its second epoch, under a process group ``timeout`` (h:m:s); run it with this folder on ``PYTHONPATH``."""
    return [
        str(Path(sys.executable).with_name("layerwise")),
        *("fit", "--config", str(REPO / "configs" / "quickstart.yaml")),
        *("--model.init_args.backbone.init_args.embed_dim=16", "--model.init_args.backbone.init_args.depth=2"),
        "--model.init_args.backbone.init_args.num_heads=2",
        *("--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1", "--trainer.max_epochs=3"),
        *("--trainer.devices=2", "--trainer.strategy=DDPStrategy", f"--trainer.strategy.init_args.timeout={timeout}"),
        *("--trainer.callbacks+=dying.Die", "--trainer.callbacks.epoch=1", f"--trainer.callbacks.how={how}"),
    ]


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
