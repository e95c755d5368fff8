"""Progress as plain lines, for runs whose output is a log file or a batch job's, not a terminal."""

import time
from pathlib import Path
from typing import Any, Literal, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from layerwise.callbacks._loggers import image_sinks
from layerwise.callbacks._runs import CheckpointPosition, evaluated_model, evaluation_line


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


class ClosingLine(Callback):
    """The one line a ``layerwise`` command ends with, printed once its work is done, by global rank zero only.

    Computed in ``teardown``, which every launcher runs in the processes that did the work (under ``ddp_spawn`` the
    workers, not the parent, which sees neither the steps taken nor the logger's version). The run folder is
    ``trainer.log_dir``, a collective: every rank asks for it, only global rank zero prints. A run that failed
    prints no closing line (Lightning calls no ``teardown`` hook then).

    Args:
        command: ``fit``, ``validate``, ``test`` or ``predict``.
        start_step: the global step a fit resumed from (0 for a new one).
        position: the checkpoint an evaluation or prediction loaded, if read from its file.
    """

    def __init__(
        self,
        command: Literal["fit", "validate", "test", "predict"],
        start_step: int = 0,
        position: Optional[CheckpointPosition] = None,
    ) -> None:
        self.command = command
        self.start_step = start_step
        self.position = position
        self.line: Optional[str] = None

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != self.command:
            return
        run = Path(trainer.log_dir or trainer.default_root_dir)  # a collective: every rank asks
        if self.command == "fit":
            self.line = fit_closing_line(trainer, run, self.start_step)
        elif self.command == "predict":
            self.line = predict_line(trainer, self.position)
        else:
            self.line = evaluation_line(trainer, self.command, self.position, run)
        if trainer.is_global_zero:
            print(self.line, flush=True)


def predict_line(trainer: Trainer, position: Optional[CheckpointPosition]) -> str:
    """The line ``predict`` ends with: which model predicted, and where the predictions went."""
    writers = [c for c in trainer.callbacks if isinstance(c, BasePredictionWriter)]
    places = [
        str(getattr(c, "output_path", None) or getattr(c, "output_dir", None) or type(c).__name__) for c in writers
    ]
    batches = f"{sum(trainer.num_predict_batches):g} batches" + (" per process" if trainer.world_size > 1 else "")
    where = f"written to {', '.join(places)}" if places else f"not written: add a writer ({_WRITER_HINT})"
    return f"layerwise predict: {evaluated_model(trainer, position)}: {batches}, predictions {where}."


_WRITER_HINT = "--trainer.callbacks+=layerwise.callbacks.EarlyExitPredictionWriter"


def fit_closing_line(trainer: Trainer, run: Path, start_step: int = 0) -> str:
    """The line a fit ends with: how far it trained, best and last ``val/acc``, the checkpoints, summaries and figures.

    ``run``: the run folder (``trainer.log_dir``, asked for on every rank). ``start_step``: the global step the fit
    resumed from (0 for a new one); a fit that stepped no further says that nothing was trained.
    """
    if trainer.global_step <= start_step:
        limits = [f"resumed at step {start_step}"] if start_step else []
        limits += [
            f"{name}={value}" for name, value in (("max_epochs", trainer.max_epochs), ("max_steps", trainer.max_steps))
        ]
        limits = [limit for limit in limits if not limit.endswith(("=-1", "=None"))]
        return f"layerwise fit: nothing was trained ({', '.join(limits)}); {run} holds no new results."
    epochs = trainer.current_epoch
    parts = [f"layerwise fit: {epochs} epoch{'' if epochs == 1 else 's'}, step {trainer.global_step}"]
    last = trainer.callback_metrics.get("val/acc")
    monitored = [c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None) == "val/acc"]
    best = monitored[0].best_model_score if monitored else None
    if last is not None:
        parts.append(f"val/acc {'' if best is None else f'best {float(best):.4f}, '}last {float(last):.4f}")
    saved = [Path(c.best_model_path).name for c in monitored if c.best_model_path]
    saved += [
        Path(path).name
        for c in trainer.checkpoint_callbacks
        if c not in monitored
        for path in (getattr(c, "last_model_path", ""), getattr(c, "best_model_path", ""))
        if path
    ]
    folders = {str(Path(c.dirpath)) for c in trainer.checkpoint_callbacks if getattr(c, "dirpath", None)}
    if saved and len(folders) == 1:
        parts.append(f"checkpoints {folders.pop()}/ ({', '.join(dict.fromkeys(saved))})")
    if (run / "layerwise").is_dir():
        places = ", ".join(sink.name for sink in image_sinks(trainer))  # where the figures went, in words
        parts.append(f"summaries {run / 'layerwise'}/, figures in {places} and by `layerwise plot {run}`")
    elif trainer.loggers:
        parts.append(f"logs {run}/")
    nonfinite = getattr(trainer.lightning_module, "nonfinite_training", None)
    parts += [said for said in ([nonfinite()] if callable(nonfinite) else []) if said]
    return "; ".join(parts) + "."
