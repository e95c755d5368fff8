"""Progress as plain lines, for runs whose output is a log file or a batch job's, not a terminal."""

import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only

from layerwise.callbacks._loggers import image_sinks


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


def fit_closing_line(trainer: Trainer, start_step: int = 0) -> str:
    """The line a fit ends with: how far it trained, best and last ``val/acc``, the checkpoints, summaries and figures.

    ``start_step``: the global step the fit resumed from (0 for a new one); a fit that stepped no further says that
    nothing was trained.
    """
    run = Path(trainer.log_dir or trainer.default_root_dir)
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
    return "; ".join(parts) + "."
