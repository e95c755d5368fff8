"""Progress as plain lines, for runs whose output is a log file or a batch job's, not a terminal."""

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only


class ProgressLines(Callback):
    """Prints one line every ``every_n_seconds`` while training, and one per finished epoch, on global rank zero.

    A progress bar draws in place, which a log file shows only at the end (or as thousands of carriage returns).
    ``layerwise fit`` uses this instead of the bar when standard output is not a terminal.

    Args:
        every_n_seconds: the least time between two lines within an epoch.
    """

    def __init__(self, every_n_seconds: float = 30.0) -> None:
        if not every_n_seconds > 0:
            raise ValueError(f"`every_n_seconds={every_n_seconds}` must be positive.")
        self.every_n_seconds = every_n_seconds
        self._last = 0.0

    @staticmethod
    def _metrics(trainer: Trainer, prefix: str) -> str:
        values = {key: value for key, value in trainer.progress_bar_metrics.items() if key.startswith(prefix)}
        return "  ".join(f"{key} {float(value):.4f}" for key, value in sorted(values.items()))

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        if now - self._last < self.every_n_seconds:
            return
        self._last = now
        batches = f"{batch_idx + 1}/{trainer.num_training_batches}"
        metrics = self._metrics(trainer, "train/")
        print(f"epoch {trainer.current_epoch} batch {batches} step {trainer.global_step}  {metrics}", flush=True)

    @rank_zero_only
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        print(
            f"epoch {trainer.current_epoch} done, step {trainer.global_step}  {self._metrics(trainer, '')}", flush=True
        )
