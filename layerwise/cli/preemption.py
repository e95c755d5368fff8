"""A preempted fit: SIGTERM or SIGUSR1 -> a resumable checkpoint, one closing line with the resume command, exit 128+N.

Lightning alone, on SIGTERM, stops the loops with a ``SIGTERMException`` (a ``SystemExit`` without a code: exit 0,
which a scheduler reads as "done") and saves nothing; each rank decides on its own signal, and its handler runs
collectives inside the signal handler. :class:`Preemption` takes over SIGTERM and SIGUSR1 for the training loop
(from ``on_train_start``, after Lightning registered its handlers; Lightning's teardown restores the handlers it
found): a signal only marks the process. At the next optimizer-step boundary every rank agrees on one decision (an
all-reduce of the marks, so a signal to any one rank stops them all, at the same step), and then every rank saves
(``trainer.save_checkpoint``, a collective) or none does. The fit stops with :class:`Preempted`, whose exit code is
128 + the signal's number (143 for SIGTERM, 138 for SIGUSR1); global rank zero's last line says so, with the command
that resumes the run. The last batch of an epoch is not a stopping point: the stop waits for the epoch's end (after
its validation), and so does a batch after which a validation runs inside the epoch (``val_check_interval``): a
resume never begins with a validation, which Lightning would take as done.

Under ``torchrun`` the closing line's resume command is ``torchrun … -m layerwise fit … --ckpt_path last``: the same
launch on every node, ``…`` standing for each node's own torchrun options, which a worker does not know; a node's
torchrun passes a SIGTERM it receives on to its workers. Under FSDP2 (``ModelParallelStrategy``) ``last.ckpt`` is a
sharded folder (every rank saves its shards, global rank zero ``meta.pt``), which ``--ckpt_path last`` finds as it
finds a file.

Under SLURM with Lightning's ``SLURMEnvironment(auto_requeue=True)`` (its default there), Lightning's SIGUSR1
handler still runs first (its ``hpc_ckpt_N.ckpt`` and ``scontrol requeue``); the requeued job's ``--ckpt_path last``
then resumes from the newer checkpoint saved here.

The checkpoint is ``last.ckpt`` in the first ``ModelCheckpoint``'s folder (Lightning's ``--ckpt_path last`` finds
it), written over a ``last.ckpt`` saved earlier (a link, as ``save_last="link"`` makes, is replaced, not followed).
It holds what a resume needs to continue the uninterrupted run: Lightning's loops, optimizers and callbacks, the
training dataloader's position (:class:`~layerwise.datamodules._resumable.ResumableDataLoader`), and, in this
checkpoint's ``layerwise_random_states``, the random states (torch, CUDA, numpy, Python) of every rank, restored at
``on_train_start``.

:func:`resume_into_run` makes ``layerwise fit … --ckpt_path last`` (or a checkpoint path of a run) continue in the
run folder it resumes, rather than in a new ``version_N``: summaries of the epochs validated before the stop stay as
written, the later ones are written once, beside them.
"""

import functools
import random
import shlex
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from layerwise._compat import take_lightning_sigterm, validates_after_this_batch
from layerwise.engines.checkpoint import LIGHTNING_META
from layerwise.errors import LayerwiseWarning

STATES_KEY = "layerwise_random_states"  # every rank's random states, in rank order, at the checkpoint's top level
SIGNALS = ("SIGTERM", "SIGUSR1")  # SIGUSR1: what SLURM's `--signal=SIGUSR1@90` sends before the time limit
EXIT_CODES = tuple(128 + getattr(signal, name) for name in SIGNALS if hasattr(signal, name))  # 143, 138


class Preempted(SIGTERMException):
    """The fit was stopped by a signal after saving a resumable checkpoint; exits with ``128 + signum``.

    A ``SIGTERMException`` (Lightning's, a ``SystemExit``): Lightning runs every callback's ``on_exception`` for it
    and re-raises it; the process then ends with its code, no traceback.
    """

    def __init__(self, signum: int, line: str) -> None:
        super().__init__(128 + signum)
        self.signum, self.line = signum, line


class Preemption(Callback):
    """Save a resumable checkpoint and stop when the fit receives SIGTERM or SIGUSR1 (see the module docstring).

    Args:
        argv: the command's arguments after ``layerwise`` (``fit …``), for the resume command in the closing line.
    """

    def __init__(self, argv: Optional[list[str]] = None) -> None:
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.received = 0  # the first signal this process received (0: none)
        self._states: Optional[list[dict[str, Any]]] = None  # every rank's random states, from the checkpoint

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # In every process (the workers under ddp_spawn), before ModelCheckpoint's setup: a resumed fit's checkpoint
        # folder holds the run's own checkpoints, which Lightning would warn of as if another run's.
        if stage == "fit" and any(arg == "--ckpt_path" or arg.startswith("--ckpt_path=") for arg in self.argv):
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")

    # -- signals ------------------------------------------------------------------------------------------------

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)
        states, self._states = self._states, None
        if states is None:
            return
        if len(states) != trainer.world_size:
            rank_zero_warn(
                f"The checkpoint holds the random states of {len(states)} processes and this fit runs "
                f"{trainer.world_size}: they are not restored, so the resumed fit does not repeat the uninterrupted "
                "one exactly.",
                category=LayerwiseWarning,
            )
            return
        set_random_states(states[trainer.global_rank])

    def _install(self, trainer: Trainer) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python handles signals in the main thread only
        if take_lightning_sigterm(trainer):  # caught by Lightning's handler before this one came
            self.received = self.received or signal.SIGTERM
        for name in SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None:  # Windows has no SIGUSR1
                continue
            previous = signal.getsignal(signum)
            if getattr(previous, "func", None) == self._receive:
                continue  # installed already (sanity check, then training)
            # SIGUSR1: Lightning's SLURM requeue handler (when registered) still runs. SIGTERM: Lightning's handler
            # would stop the loops by itself (exit 0, nothing saved, one rank at a time): this one replaces it.
            chained = previous if signum == signal.SIGUSR1 and callable(previous) else None
            signal.signal(signum, functools.partial(self._receive, chained))

    def _receive(self, chained: Any, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        if chained is not None:
            chained(signum, frame)

    # -- stopping points ----------------------------------------------------------------------------------------

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches or batch_idx + 1 >= trainer.num_training_batches:
            return  # inside an accumulation, or the epoch's last batch (its validation comes first)
        if validates_after_this_batch(trainer):  # Lightning validates inside the epoch right after this batch
            return  # a validation follows this batch: a resume would take it as done, so stop after the next one
        if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
            return  # the fit ends here anyway
        self._stop_if_signalled(trainer, f"in epoch {trainer.current_epoch} after batch {batch_idx + 1}")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
        if (
            trainer.should_stop
            or (max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1)
            or (max_steps is not None and 0 <= max_steps <= trainer.global_step)
        ):
            return  # the fit ends here anyway: it completes
        self._stop_if_signalled(trainer, f"at the end of epoch {trainer.current_epoch}")

    def _stop_if_signalled(self, trainer: Trainer, where: str) -> None:
        signum = agreed_signal(trainer, self.received)
        if not signum:
            return
        path = preemption_checkpoint(trainer)
        if trainer.is_global_zero and path.is_symlink():
            path.unlink()  # ModelCheckpoint(save_last="link"): not written through into the checkpoint it names
        trainer.save_checkpoint(path, weights_only=False)  # every rank: a collective
        name = signal.Signals(signum).name
        line = (
            f"layerwise fit: stopped by {name} {where} (step {trainer.global_step}); resumable checkpoint {path}; "
            f"resume with: {resume_command(self.argv, trainer, path)}"
        )
        if trainer.is_global_zero:  # now: under ddp_spawn the parent ends the other workers once one has exited
            print(line, flush=True)
        raise Preempted(signum, line)

    # -- state --------------------------------------------------------------------------------------------------

    # In the checkpoint's own key, not as this callback's state: `validate --ckpt_path` (which has no Preemption)
    # would be warned by Lightning that a callback of the checkpoint is missing.

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[STATES_KEY] = gather(random_states())  # a collective under DDP: every rank dumps a checkpoint

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._states = checkpoint.get(STATES_KEY)


def add_preemption(trainer: Trainer, argv: list[str]) -> Preemption:
    """Add a :class:`Preemption` to a fit's Trainer, before its checkpoint callbacks (its ``setup`` runs first)."""
    preemption = Preemption(argv)
    callbacks = trainer.callbacks  # type: ignore[attr-defined]  # the Trainer's list (a property Lightning types loosely)
    first = next((index for index, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks.insert(first, preemption)
    return preemption


def agreed_signal(trainer: Trainer, received: int) -> int:
    """The largest signal number any rank received (0: none); one all-reduce, so every rank decides alike."""
    if trainer.world_size == 1:
        return received
    mark = torch.tensor(received, dtype=torch.int64, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(mark, reduce_op="max").item())


def preemption_checkpoint(trainer: Trainer) -> Path:
    """``last.ckpt`` in the first ``ModelCheckpoint``'s folder, else in ``<log_dir>/checkpoints``."""
    name = ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath) / name
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / name


def resume_command(argv: list[str], trainer: Trainer, path: Path) -> str:
    """``layerwise <argv> --ckpt_path last`` (any ``--ckpt_path`` given left out); the path where ``last`` misses.

    Under ``torchrun``: ``torchrun … -m layerwise <argv> --ckpt_path last``, the ``…`` standing for each node's own
    torchrun options (its ``--node_rank`` differs), which a worker does not know.
    """
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    found = any(
        isinstance(c, ModelCheckpoint) and c.dirpath and Path(c.dirpath) == path.parent
        for c in trainer.checkpoint_callbacks
    )
    return f"{launched_as()} {shlex.join([*kept, '--ckpt_path', 'last' if found else str(path)])}"


def launched_as() -> str:
    """How this process was started: ``layerwise``, or under torchrun ``torchrun … -m layerwise`` or ``… --no-python``.

    ``-m layerwise`` for a module run, ``--no-python layerwise`` for the script; ``…``: each node's torchrun options.
    """
    if not TorchElasticEnvironment.detect():
        return "layerwise"
    return f"torchrun … {'-m' if Path(sys.argv[0]).name == '__main__.py' else '--no-python'} layerwise"


# ------------------------------------------------------------------------------------- random states of every rank
# Plain tensors, tuples and numbers only: a checkpoint is read with torch.load(weights_only=True).


def random_states() -> dict[str, Any]:
    """This process's random states: torch (CPU and every CUDA device), numpy's global and Python's ``random``."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(position),
            int(has_gauss),
            float(gauss),
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any]) -> None:
    """Restore what :func:`random_states` returned."""
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def gather(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order (one ``all_gather_object`` under DDP; ``[state]`` in one process)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, state)
    return gathered


# ------------------------------------------------------------------------------------- resuming into the same run


def resume_into_run(trainer_config: Any, ckpt_path: Any) -> Optional[Path]:
    """Point a versioned logger (TensorBoard, CSV) of a resumed fit at the run it resumes; returns that run folder.

    ``ckpt_path``: ``last`` (the run whose ``checkpoints/last*.ckpt`` is newest among the logger's versions) or a
    checkpoint in ``<run>/checkpoints/``. Only when the logger's ``save_dir`` and ``name`` are that run's and its
    ``version`` is not set: a place the user chose wins. None when nothing was pointed.
    """
    logger = getattr(trainer_config, "logger", None)
    init_args = getattr(logger, "init_args", None)
    if init_args is None or not str(getattr(logger, "class_path", "")).endswith(("TensorBoardLogger", "CSVLogger")):
        return None
    if init_args.get("version") is not None or init_args.get("save_dir") is None:
        return None
    runs = Path(init_args.save_dir) / (init_args.get("name") or "lightning_logs")
    if str(ckpt_path) == "last":  # a file, or the folder of a sharded (FSDP2) checkpoint
        found = {path: saved_at(path) for path in runs.glob("*/checkpoints/last*.ckpt")}
        lasts = {path: time for path, time in found.items() if time is not None}
        run = max(lasts, key=lasts.__getitem__).parent.parent if lasts else None
    else:
        path = Path(str(ckpt_path))
        run = path.parent.parent if path.parent.name == "checkpoints" else None
    if run is None or not run.is_dir() or run.parent.resolve() != runs.resolve():
        return None
    init_args.version = run.name
    return run


def saved_at(checkpoint: Path) -> Optional[float]:
    """When a checkpoint file, or a sharded checkpoint folder (its ``meta.pt``, written last), was saved; else None."""
    path = checkpoint / LIGHTNING_META if checkpoint.is_dir() else checkpoint
    return path.stat().st_mtime if path.is_file() else None
