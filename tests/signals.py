"""Test only: a callback that sends a signal at a chosen training step, so that a test stops a fit at a precise,
repeatable point (a real scheduler's SIGTERM arrives whenever it does). Passed to the real ``layerwise fit`` through
its config (``--trainer.callbacks+=signals.SignalAt``, ``tests/`` on ``PYTHONPATH``)."""

import os
import signal

from lightning.pytorch import Callback, LightningModule, Trainer


class SignalAt(Callback):
    """Send ``signal`` (a name: SIGTERM, SIGUSR1) at the end of training batch ``step`` (the global step once it is
    done, from 1) on global rank ``rank`` (a resumed fit starts past it: not again), to ``target``: this ``process``,
    or its ``launcher`` (the parent process: under ``torchrun``, the node's agent, which passes the signal on to its
    workers, as a scheduler's SIGTERM to a node reaches it)."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: int = 0, target: str = "process") -> None:
        if target not in ("process", "launcher"):
            raise ValueError(f"target={target!r}: `process` or `launcher`")
        self.step, self.signal, self.rank, self.target = step, signal, rank, target

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args, **kwargs) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid() if self.target == "process" else os.getppid(), getattr(signal, self.signal))
