"""Progress as plain lines, for runs whose output is a log file or a batch job's, not a terminal."""

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor


class ProgressLines(Callback):
    """Prints one line every ``every_n_seconds`` while training, and one per finished epoch, on global rank zero.

    A progress bar draws in place, which a log file shows only at the end (or as thousands of carriage returns).
    ``layerwise fit`` uses this instead of the bar when standard output is not a terminal. The lines within an epoch
    show the last batch's values; the epoch's line shows the means over its batches (this rank's): the training
    loss under each objective the module trained (``train/loss_aligned`` and ``train/loss_last`` for alternating
    training, whose ``train/loss`` switches objective from batch to batch), ``train/acc``, then the validation's.

    Args:
        every_n_seconds: the least time between two lines within an epoch.
    """

    def __init__(self, every_n_seconds: float = 30.0) -> None:
        if not every_n_seconds > 0:
            raise ValueError(f"`every_n_seconds={every_n_seconds}` must be positive.")
        self.every_n_seconds = every_n_seconds
        self._last = 0.0
        self._sums: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    @staticmethod
    def _metrics(trainer: Trainer, prefix: str) -> str:
        values = {key: value for key, value in trainer.progress_bar_metrics.items() if key.startswith(prefix)}
        return "  ".join(f"{key} {float(value):.4f}" for key, value in sorted(values.items()))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._sums, self._counts = {}, {}

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_global_zero:
            self._add(trainer, pl_module, outputs)
            self._batch_line(trainer, batch_idx)

    def _add(self, trainer: Trainer, pl_module: LightningModule, outputs: Any) -> None:
        """Add this batch's loss (under its objective) and accuracy to the epoch's sums, on the device (no sync)."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        objective = getattr(pl_module, "objective", None)
        values = {f"train/loss_{objective}" if objective else "train/loss": loss}
        values["train/acc"] = trainer.callback_metrics.get("train/acc")
        for key, value in values.items():
            if isinstance(value, Tensor):
                self._sums[key] = self._sums.get(key, 0) + value.detach().double()
                self._counts[key] = self._counts.get(key, 0) + 1

    def _batch_line(self, trainer: Trainer, batch_idx: int) -> None:
        now = time.monotonic()
        if now - self._last < self.every_n_seconds:
            return
        self._last = now
        batches = f"{batch_idx + 1}/{trainer.num_training_batches}"
        metrics = self._metrics(trainer, "train/")
        print(f"epoch {trainer.current_epoch} batch {batches} step {trainer.global_step}  {metrics}", flush=True)

    @rank_zero_only
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        means = "  ".join(f"{key} {float(self._sums[key]) / self._counts[key]:.4f}" for key in sorted(self._sums))
        validation = self._metrics(trainer, "val")
        print(
            f"epoch {trainer.current_epoch} done, step {trainer.global_step}  epoch means: {means or 'none'}"
            + (f"  {validation}" if validation else ""),
            flush=True,
        )
