"""The one way layerwise loads a module from a Lightning checkpoint written by ``layerwise fit``."""

import functools
import importlib
import io
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union, cast

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import LightningModule, Trainer
from torch import nn

from layerwise._compat import saves_sharded
from layerwise.errors import UsageError
from layerwise.results import write_atomic

TRUSTED_PACKAGES = ("layerwise.",)
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format (a zip archive) since PyTorch 1.6
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint folder
LIGHTNING_META = "meta.pt"  # what Lightning's ModelParallelStrategy saves beside the shards (all but the tensors)


def is_sharded_checkpoint(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a sharded checkpoint folder (FSDP2 under Lightning's ``ModelParallelStrategy``)."""
    return Path(path).is_dir() and (Path(path) / DCP_METADATA).is_file()


def check_checkpoint(checkpoint: Union[str, Path], option: str = "--checkpoint") -> Path:
    """``checkpoint`` as a Path, or one clear ValueError naming ``option`` and the file; reads no tensor.

    A torch.save archive whose end (the zip index) is missing — a copy or a write cut short — is reported as
    truncated (torch itself would answer ``OSError: [Errno 22] Invalid argument`` or a zip error). A sharded
    checkpoint folder (:func:`is_sharded_checkpoint`) passes; any other folder does not.
    """
    path = Path(checkpoint)
    if path.is_dir():
        if is_sharded_checkpoint(path):
            return path
        raise UsageError(
            f"`{option}={path}` is a folder, neither a checkpoint file nor a sharded checkpoint (it has no "
            f"`{DCP_METADATA}` of torch.distributed.checkpoint)."
        )
    if not path.is_file():
        raise UsageError(f"`{option}={path}`: no such file.")
    with open(path, "rb") as file:
        head = file.read(len(ZIP_MAGIC))
    zipped = head == ZIP_MAGIC
    if not zipped and not head.startswith(b"\x80"):  # neither torch.save's archive nor its legacy pickle
        raise UsageError(f"`{option}={path}` is not a PyTorch checkpoint (neither a torch.save archive nor a pickle).")
    if zipped and not zipfile.is_zipfile(path):
        raise UsageError(
            f"`{option}={path}` is truncated ({path.stat().st_size:,} bytes, the end of the archive is missing): "
            "the copy or the save was cut short; copy it again or use another checkpoint."
        )
    return path


def read_checkpoint(
    checkpoint: Union[str, Path], option: str = "--checkpoint", weights_only: Optional[bool] = True
) -> dict[str, Any]:
    """The dict of a checkpoint file or of a sharded checkpoint folder, or one clear ValueError naming ``option``.

    Checked first by :func:`check_checkpoint` (missing, truncated); anything else torch cannot read is reported as
    not a PyTorch checkpoint. Tensors of a zip archive stay memory-mapped on disk. A sharded folder is consolidated
    in memory (:func:`consolidate_sharded`), so one process reads what FSDP2 on many wrote.
    """
    path = check_checkpoint(checkpoint, option)
    if path.is_dir():
        return consolidate_sharded(path, option, weights_only)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=zipfile.is_zipfile(path))
    except Exception as error:  # a foreign file: pickle and torch errors alike
        reason = (str(error).strip().splitlines() or [""])[0][:200]  # torch's own advice runs over many lines
        raise UsageError(f"`{option}={path}` is not a PyTorch checkpoint ({type(error).__name__}: {reason}).") from None
    if not isinstance(saved, dict):
        raise UsageError(f"`{option}={path}` holds a {type(saved).__name__}, not a Lightning checkpoint (a dict).")
    return saved


def consolidate_sharded(
    folder: Union[str, Path], option: str = "--checkpoint", weights_only: Optional[bool] = True
) -> dict[str, Any]:
    """The whole checkpoint of a sharded folder, as Lightning's ``ModelParallelStrategy`` (FSDP2) saves one.

    The shards are gathered by torch.distributed.checkpoint's public ``dcp_to_torch_save`` (on one process, no
    process group; the whole model must fit in CPU memory), and the folder's ``meta.pt`` (epoch, step,
    hyper-parameters, callback states) is merged in. The sharded optimizer states (``optimizer_N``, keyed by
    parameter name) are left out: only a run with the same strategy can resume from them, and it reads the folder
    itself. The same as Lightning's ``python -m lightning.fabric.utilities.consolidate_checkpoint FOLDER``.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(folder)
    with tempfile.TemporaryDirectory(prefix="layerwise-consolidate-") as scratch:
        whole = Path(scratch) / "whole.pt"
        try:
            dcp_to_torch_save(path, whole)
        except Exception as error:  # a missing or damaged shard
            raise UsageError(
                f"`{option}={path}` is a sharded checkpoint folder whose shards cannot be read "
                f"({type(error).__name__}: {error})."
            ) from None
        saved = torch.load(whole, map_location="cpu", weights_only=True, mmap=True)  # mapped: survives the unlink
    if (path / LIGHTNING_META).is_file():
        saved.update(read_checkpoint(path / LIGHTNING_META, option, weights_only))
    return {key: value for key, value in saved.items() if not key.startswith("optimizer_")}


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


def evaluate_at(trainer: Trainer, position: CheckpointPosition) -> Optional[dict[str, Any]]:
    """Set the Trainer's epoch and step counters to the checkpoint's, for an evaluation of it; returns those replaced.

    The counters label the evaluation: the summary's name and header, the console table, the step of the logged
    values. A plain ``Trainer.validate(ckpt_path=…)`` restores only the weights, and its counters stay where they
    were (0 and 0 in a new Trainer), as if the checkpoint were the model before training. The fit loop's progress is
    loaded from the checkpoint's; the state returned (None when nothing changed) puts the Trainer's own back with
    ``trainer.fit_loop.load_state_dict``.
    """
    here = (trainer.current_epoch, trainer.global_step)
    if position.fit_loop is None or here == (position.epoch, position.global_step):
        return None
    replaced = trainer.fit_loop.state_dict()
    trainer.fit_loop.load_state_dict(position.fit_loop)
    return replaced


class CheckpointReader(TorchCheckpointIO):
    """Lightning's checkpoint IO, reading through :func:`read_checkpoint` (one clear error for a broken file).

    :class:`~layerwise.lightning_modules.LayerwiseModule` puts it in place of the default ``TorchCheckpointIO`` in
    its ``setup`` (before Lightning restores ``--ckpt_path``), so ``fit/validate/test/predict --ckpt_path`` answer a
    truncated or foreign file in one line naming it, and ``validate/test/predict`` on one process (or under DDP) read
    a sharded FSDP2 checkpoint folder. Resuming ``fit`` from such a folder needs its sharded optimizer state: that
    is refused here in one line (run it under the strategy that wrote it). Writing goes through
    :func:`~layerwise.results.write_atomic` (Lightning's own writes into a temporary file in the system's temporary
    folder, then moves it: a copy into the final name when that folder is on another disk), so a full disk never
    leaves a truncated checkpoint under its name, and the error names the checkpoint.

    Args:
        fitting: whether the trainer restores for ``fit`` (a resume).
    """

    def __init__(self, fitting: bool = False) -> None:
        super().__init__()
        self.fitting = fitting

    def load_checkpoint(
        self, path: Any, map_location: Optional[Callable] = lambda storage, loc: storage, weights_only: Any = None
    ) -> dict[str, Any]:
        if self.fitting and is_sharded_checkpoint(path):
            raise UsageError(
                f"`--ckpt_path={path}` is a sharded (FSDP2) checkpoint: resume `fit` from it with the strategy that "
                "wrote it (`--config trainer/fsdp_gpu`, the same number of processes); one process can "
                "validate, test, predict and export from it."
            )
        return read_checkpoint(path, "--ckpt_path", weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or "://" in str(path):  # Lightning's for remote folders and its options
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        write_atomic(path, lambda file: torch.save(checkpoint, file))


def use_checkpoint_reader(trainer: Trainer, stage: str) -> None:
    """Make ``trainer`` read checkpoints through :class:`CheckpointReader` unless it was given its own IO plugin.

    Under Lightning's own ``ModelParallelStrategy`` (FSDP2), which writes its sharded checkpoints without the IO
    plugin, its ``save_checkpoint`` becomes :func:`save_sharded` (a sharded checkpoint's ``meta.pt`` atomic).
    """
    if type(trainer.strategy.checkpoint_io) in (TorchCheckpointIO, CheckpointReader):
        trainer.strategy.checkpoint_io = CheckpointReader(fitting=stage == "fit")
    strategy = trainer.strategy
    if saves_sharded(strategy) and getattr(strategy.save_checkpoint, "func", None) is not save_sharded:
        # the instance's method, as the IO plugin above is the instance's: a user's subclass keeps its own saving
        strategy.save_checkpoint = functools.partial(save_sharded, strategy)  # type: ignore[method-assign]


def save_sharded(strategy: Any, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
    """``ModelParallelStrategy.save_checkpoint`` with ``save_distributed_checkpoint``, its ``meta.pt`` atomic.

    What Lightning 2.6 does (every rank: the shards of the weights and of the optimizer states, by
    ``torch.distributed.checkpoint.save`` into the folder ``filepath``), except the last step: global rank zero writes
    the rest of the checkpoint (epoch, step, loops, callbacks, random states) through
    :func:`~layerwise.results.write_atomic` instead of ``torch.save`` into the final name, so that a full disk or a
    stop during that write leaves the earlier ``meta.pt`` whole (or none), never a truncated one. The shards are
    written in place by torch, as under Lightning.
    """
    from torch.distributed.checkpoint import FileSystemWriter, save  # torch 2.2's signature too (no checkpoint_id)

    if storage_options is not None:
        raise TypeError(f"`{type(strategy).__name__}.save_checkpoint(..., storage_options=...)` is not supported.")
    path = Path(strategy.broadcast(filepath))  # every rank saves into rank zero's path
    if path.is_file():  # a single-file checkpoint saved there before
        path.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    shards = {"state_dict": checkpoint.pop("state_dict")}
    shards.update({f"optimizer_{index}": state for index, state in enumerate(checkpoint.pop("optimizer_states", []))})
    save(shards, storage_writer=FileSystemWriter(path))
    if strategy.global_rank == 0:
        write_atomic(path / LIGHTNING_META, lambda file: torch.save(checkpoint, file))


def load_module(
    checkpoint: Union[str, Path], option: str = "--checkpoint", trusted: tuple[str, ...] = TRUSTED_PACKAGES
) -> LightningModule:
    """The LayerwiseModule of a checkpoint, its class taken from the checkpoint's ``hyper_parameters['_class_path']``.

    The file is read with ``weights_only=True`` (no pickled code runs) and the class path is checked against
    ``trusted`` package prefixes (or modules the program has already imported) *before* anything is imported, so a
    checkpoint from elsewhere cannot make layerwise import a module from the current folder. Errors name ``option``.
    ``checkpoint`` may also be the sharded folder an FSDP2 run writes (:func:`consolidate_sharded`).
    """
    path = Path(checkpoint)
    saved = read_checkpoint(path, option)
    class_path = saved.get("hyper_parameters", {}).get("_class_path")
    if not class_path:
        raise ValueError(
            f"`{option}={path}`: no hyper_parameters['_class_path'] (write checkpoints with `layerwise fit`)."
        )
    module_name, _, class_name = class_path.rpartition(".")
    if not class_path.startswith(trusted) and module_name not in sys.modules:
        raise ValueError(
            f"`{option}={path}` names the class {class_path!r}, outside the trusted packages {list(trusted)} and not "
            "imported yet; import its module first, or load it with its class's load_from_checkpoint, if you trust it."
        )
    module_class = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(module_class, type) and issubclass(module_class, LightningModule)):
        raise ValueError(f"`{option}={path}`: {class_path!r} is not a LightningModule class.")
    if path.is_dir():  # a sharded folder, consolidated above: Lightning loads the whole checkpoint from memory
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        buffer.seek(0)
        return module_class.load_from_checkpoint(buffer, map_location="cpu", weights_only=True)
    return module_class.load_from_checkpoint(path, map_location="cpu", weights_only=True)


def frozen_backbone(owner: str, checkpoint: Optional[Union[str, Path]], backbone: Optional[nn.Module]) -> nn.Module:
    """The backbone a module studies without training it: given, or read from a layerwise checkpoint (not both).

    ``owner`` names the module in the one-line error (``TunedLens``, ``LinearProbes``); the checkpoint is read by
    :func:`load_module`, its errors naming ``--model.init_args.checkpoint``.
    """
    option = "--model.init_args"
    if (checkpoint is None) == (backbone is None):
        raise ValueError(f"{owner}: give exactly one of `{option}.checkpoint` and `{option}.backbone`.")
    if checkpoint is not None:
        backbone = cast(nn.Module, load_module(checkpoint, option=f"{option}.checkpoint").backbone)
    assert backbone is not None
    return backbone


def load_model(
    spec: Union[str, nn.Module],
    option: str,
    task: Literal["base", "causal_lm", "classification", "clip"] = "base",
    dtype: Optional[str] = None,
    device_map: Optional[Union[str, dict[str, Union[str, int]]]] = None,
    offload_folder: Optional[Union[str, Path]] = None,
) -> nn.Module:
    """The table-known model of a layerwise checkpoint (``.ckpt``), of a hub id / folder, or inside a module.

    A hub id or folder is loaded with the Auto class of ``task`` (``base``: ``AutoModel``; ``clip``:
    ``CLIPModel``), in ``dtype`` if given, and spread over devices by ``device_map`` (``"auto"`` or a dict from
    module to ``"cpu"``, a GPU index or ``"disk"``; accelerate's placement, offloaded weights stored in
    ``offload_folder``) if given.
    """
    from layerwise.features.paths import find_model

    if isinstance(spec, nn.Module):
        return find_model(spec, option)
    if str(spec).endswith(".ckpt") or is_sharded_checkpoint(spec):
        return find_model(load_module(spec, option), option)
    import transformers

    from layerwise.features.hf import build_model

    auto = {
        "base": "AutoModel",
        "causal_lm": "AutoModelForCausalLM",
        "classification": "AutoModelForSequenceClassification",
        "clip": "CLIPModel",
    }
    options: dict[str, Any] = {"dtype": getattr(torch, dtype)} if dtype and dtype != "auto" else {}
    if device_map is not None:
        options["device_map"] = device_map
        if offload_folder is not None:
            options["offload_folder"] = str(offload_folder)
    elif offload_folder is not None:
        raise ValueError(f"`{option}`: an offload folder needs a device_map that offloads to 'disk'.")
    return build_model(getattr(transformers, auto[task]), spec, None, True, options or None, option)
