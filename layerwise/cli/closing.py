"""The one line each ``layerwise`` command ends with: what it ran, and where its results went."""

import atexit
from pathlib import Path
from typing import Literal, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from layerwise import __version__
from layerwise.callbacks._loggers import image_sinks
from layerwise.engines.checkpoint import CheckpointPosition


class ClosingLine(Callback):
    """The one line a ``layerwise`` command ends with, printed once its work is done, by global rank zero only.

    Computed in ``teardown``, which every launcher runs in the processes that did the work (under ``ddp_spawn`` the
    workers, not the parent, which sees neither the steps taken nor the logger's version). The run folder is
    ``trainer.log_dir``, a collective: every rank asks for it, only global rank zero prints. A run that failed
    prints no closing line (Lightning calls no ``teardown`` hook then). Each process of the command also destroys its
    process group when it exits (:func:`destroy_process_group`).

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

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # In every process of the command (the workers under ddp_spawn), once its process group exists.
        atexit.unregister(destroy_process_group)  # registered once per process, however many commands ran
        atexit.register(destroy_process_group)

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


def destroy_process_group() -> None:
    """Destroy the default process group at the process's exit, while the interpreter is whole.

    Lightning does so for NCCL only. A gloo group left to the interpreter's finalization still has its worker
    threads: a ``ddp_spawn`` worker on CPUs then ended in "terminate called without an active exception" (SIGABRT)
    after its closing line, now and then (pytorch/pytorch#190489), and the command failed.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


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
    return "; ".join([*parts, f"layerwise {__version__}"]) + "."  # which layerwise made these results


def evaluated_model(trainer: Trainer, position: Optional[CheckpointPosition]) -> str:
    """Which model a command ran: the checkpoint with its epoch and step, or the model as configured."""
    if position is not None:
        return f"checkpoint {position.path} (epoch {position.epoch}, step {position.global_step})"
    return f"checkpoint {trainer.ckpt_path}" if trainer.ckpt_path else "the model as configured (no --ckpt_path)"


def evaluation_line(trainer: Trainer, command: str, position: Optional[CheckpointPosition], run: Path) -> str:
    """The line ``validate``/``test`` end with: which model was evaluated, and where its results went.

    ``run``: the run folder (``trainer.log_dir``, asked for on every rank: it is a collective).
    """
    return f"layerwise {command}: {evaluated_model(trainer, position)} -> {run}"
