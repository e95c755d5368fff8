"""Where a command's run goes: an evaluation of a checkpoint beside the run it came from, a fit's config.yaml.

``layerwise validate/test --ckpt_path <run>/checkpoints/X.ckpt`` evaluates the model of that run, so its results go
under the run, in ``<run>/<command>_epoch_EEE_step_SSSSSSS/`` (the checkpoint's epoch and global step), and are
labelled by them: the Trainer's epoch and step counters are the checkpoint's while it evaluates, so the summary JSON,
the console table and the TensorBoard points all carry them. A sub-folder, not the run folder itself: the fit's own
summary of that epoch and step (``<run>/layerwise/val_epoch_EEE_step_SSSSSSS.json``) stays as the fit wrote it.
:class:`KeptConfig` writes LightningCLI's ``config.yaml``, moving an earlier run's aside.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback

from layerwise.engines.checkpoint import LIGHTNING_META
from layerwise.results import evaluated_split, keep_earlier


@dataclass(frozen=True)
class CheckpointPosition:
    """Where in training a checkpoint was saved, read from the file without building the model.

    Attributes:
        path: the checkpoint file (or the folder of a sharded checkpoint: FSDP2's ``last.ckpt/``).
        epoch: its ``epoch`` (the Trainer's ``current_epoch`` when it was saved).
        global_step: its ``global_step``.
        fit_loop: the fit loop's state (its progress counters), if the checkpoint holds one.
        dirpaths: ``ModelCheckpoint.state_key`` -> the ``dirpath`` it saved into.
    """

    path: Path
    epoch: int
    global_step: int
    fit_loop: Optional[dict[str, Any]] = None
    dirpaths: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``epoch_EEE_step_SSSSSSS``, as the summaries of a fit are named."""
        return f"epoch_{self.epoch:03d}_step_{self.global_step:07d}"

    @property
    def run(self) -> Optional[Path]:
        """The run folder the checkpoint came from (``<run>/checkpoints/<file>``), else None."""
        return self.path.parent.parent if self.path.parent.name == "checkpoints" else None


def read_position(ckpt_path: Any) -> Optional[CheckpointPosition]:
    """The position of the checkpoint ``ckpt_path``; None for Lightning's names, another folder or an unreadable file.

    A file's tensors are memory-mapped, not read: only the counters are looked at. A sharded checkpoint (the folder
    FSDP2's ``ModelParallelStrategy`` and ``FSDPStrategy(state_dict_type="sharded")`` save) keeps its counters and
    callback states in ``meta.pt`` beside the shards, written by global rank zero: that file is read.
    """
    import torch

    path = Path(str(ckpt_path))
    source = path / LIGHTNING_META if path.is_dir() else path
    if not source.is_file():
        return None
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a checkpoint Lightning reads otherwise (or reports itself)
        return None
    if not isinstance(checkpoint, dict) or "epoch" not in checkpoint or "global_step" not in checkpoint:
        return None
    callbacks = checkpoint.get("callbacks") or {}
    dirpaths = {
        key: state["dirpath"] for key, state in callbacks.items() if isinstance(state, dict) and "dirpath" in state
    }
    loops = checkpoint.get("loops") or {}
    return CheckpointPosition(
        path, int(checkpoint["epoch"]), int(checkpoint["global_step"]), loops.get("fit_loop"), dirpaths
    )


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
    if position.fit_loop is not None:
        trainer.fit_loop.load_state_dict(position.fit_loop)
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
    """LightningCLI's ``config.yaml``; one that an earlier run left in the same folder is moved aside, not overwritten.

    Without a logger, or with W&B or MLflow first, runs share one folder. LightningCLI would either refuse to start
    (``overwrite=False``) or write over the earlier run's config (``overwrite=True``): here it goes to
    ``config.yaml.earlier-<time>``, with a warning, as the earlier run's summaries do.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.already_saved and self.save_to_log_dir:
            log_dir = trainer.log_dir  # a collective: every rank asks
            path = Path(log_dir) / self.config_filename if log_dir and "://" not in str(log_dir) else None
            if trainer.is_global_zero and path is not None and path.is_file():
                keep_earlier(path, "config")
        super().setup(trainer, pl_module, stage)
