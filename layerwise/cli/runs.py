"""Where a command's run goes: an evaluation of a checkpoint beside the run it came from, a fit's config.yaml.

``layerwise validate/test --ckpt_path <run>/checkpoints/X.ckpt`` evaluates the model of that run, so its results go
under the run, in ``<run>/<command>_epoch_EEE_step_SSSSSSS/`` (the checkpoint's epoch and global step), and are
labelled by them: the Trainer's epoch and step counters are the checkpoint's while it evaluates, so the summary JSON,
the console table and the TensorBoard points all carry them. A sub-folder, not the run folder itself: the fit's own
summary of that epoch and step (``<run>/layerwise/val_epoch_EEE_step_SSSSSSS.json``) stays as the fit wrote it.
:class:`KeptConfig` writes LightningCLI's ``config.yaml``, moving an earlier run's aside.
"""

from pathlib import Path
from typing import Any, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback

from layerwise.engines.checkpoint import CheckpointPosition, evaluate_at
from layerwise.results import evaluated_split, keep_earlier, write_text_atomic


def evaluation_folder(run: Path, command: str, position: CheckpointPosition) -> str:
    """``<command>_epoch_EEE_step_SSSSSSS``, with ``-v1``, ``-v2``… when an earlier evaluation holds that name."""
    name = f"{command}_{position.label}"
    version = 0
    while (run / (name if not version else f"{name}-v{version}")).exists():
        version += 1
    return name if not version else f"{name}-v{version}"


def place_logger(trainer_config: Any, command: str, position: CheckpointPosition) -> Optional[Path]:
    """Point a ``TensorBoardLogger`` of the parsed Trainer config at ``<run>/<evaluation folder>``; returns that folder.

    Only when the checkpoint lies in ``<run>/checkpoints/`` and the logger still points where that run lives: its
    ``save_dir`` and ``name`` are the run's (as the config that trained it set them), and its ``version`` and
    ``sub_dir`` are not set. A ``save_dir``, ``name``, ``version`` or ``sub_dir`` the user gave for another place is
    the user's choice and wins: None, and the logger writes where it says.
    """
    run = position.run
    logger = getattr(trainer_config, "logger", None)
    init_args = getattr(logger, "init_args", None)
    if run is None or init_args is None or not str(getattr(logger, "class_path", "")).endswith("TensorBoardLogger"):
        return None
    if init_args.get("version") is not None or init_args.get("sub_dir") is not None:
        return None
    save_dir, name = init_args.get("save_dir"), init_args.get("name")
    if save_dir is None or Path(save_dir).resolve() != run.parent.parent.resolve() or name != run.parent.name:
        return None
    folder = evaluation_folder(run, command, position)
    init_args.save_dir, init_args.name = str(run.parent.parent), run.parent.name
    init_args.version, init_args.sub_dir = run.name, folder
    return run / folder


def take_position(trainer: Trainer, position: CheckpointPosition) -> None:
    """Set the Trainer's epoch and step counters to the checkpoint's, and its checkpoint callbacks' folders.

    The counters label the evaluation (summary name, console table, logged step); the folders are the ones the
    checkpoint's ``ModelCheckpoint`` states were saved with, so restoring them does not warn that the dirpath changed
    (nothing is saved outside ``fit``).
    """
    evaluate_at(trainer, position)
    for callback in trainer.checkpoint_callbacks:
        dirpath = position.dirpaths.get(getattr(callback, "state_key", ""))
        if getattr(callback, "dirpath", "") is None and dirpath is not None:
            callback.dirpath = dirpath


def test_split_line(datamodule: Any) -> Optional[str]:
    """What ``layerwise test`` says before it evaluates another split than a test split, else None."""
    split = evaluated_split(datamodule, "test")
    if split == "test":
        return None
    return (
        f"layerwise test: {type(datamodule).__name__} has no test split; testing its {split} split "
        f'(recorded as "split": "{split}" in the summary).'
    )


class KeptConfig(SaveConfigCallback):
    """LightningCLI's ``config.yaml``, written atomically; one that an earlier run left in the folder is moved aside.

    Without a logger, or with W&B or MLflow first, runs share one folder. LightningCLI would either refuse to start
    (``overwrite=False``) or write over the earlier run's config (``overwrite=True``): here it goes to
    ``config.yaml.earlier-<time>``, with a warning, as the earlier run's summaries do. The file is written as every
    file of layerwise is (:func:`~layerwise.results.write_text_atomic`: a temporary name, then renamed), not by
    jsonargparse in place: a full disk leaves no truncated ``config.yaml`` and ends the command with one line naming it.
    Lightning's own writing into the log folder is turned off (``save_to_log_dir``) and done here, in
    :meth:`save_config`, which Lightning calls on global rank zero; the folder, a collective, is asked in
    :meth:`setup` on every rank. A remote log folder (``s3://``…) or ``multifile`` is written by Lightning's way.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._into_log_dir = self.save_to_log_dir
        self._log_dir: Optional[str] = None  # asked in setup, on every rank
        self.save_to_log_dir = False  # Lightning's writing in place: done by save_config instead

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.already_saved and self._into_log_dir:
            self._log_dir = trainer.log_dir  # a collective: every rank asks
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Write ``<log_dir>/config.yaml`` (global rank zero), an earlier run's moved aside first."""
        if self._log_dir is None:
            return
        if "://" in str(self._log_dir) or self.multifile:
            self.parser.save(
                self.config,
                f"{self._log_dir}/{self.config_filename}",
                skip_none=False,
                overwrite=self.overwrite,
                multifile=self.multifile,
            )
            return
        path = Path(self._log_dir) / self.config_filename
        if path.is_file():
            keep_earlier(path, "config")
        write_text_atomic(path, dumped_config(self.parser, self.config))


def dumped_config(parser: Any, config: Any) -> str:
    """The config as LightningCLI saves it (every value, ``None`` included), as text."""
    import inspect

    parameters = inspect.signature(parser.dump).parameters
    unset = "skip_unset" if "skip_unset" in parameters else "skip_none"  # its name before jsonargparse 4.49
    return str(parser.dump(config, **{unset: False}))
