"""The one place where layerwise uses a private API of a dependency, each named, pinned and tested.

``tests/project/test_compat.py`` fails loudly when one of them moves. Checked on: lightning 2.6.

Elsewhere: ``LightningCLI._parse_ckpt_path`` and ``LightningCLI._run_subcommand``, overridden in
``layerwise/cli/app.py`` (``LayerwiseCLI``) to answer a bad ``--ckpt_path`` and a ``UsageError`` raised inside a run in
one line; ``tests/lightning_modules/test_checkpoint_errors.py`` checks that they still exist.
"""

from typing import Any, Optional

CHECKED_LIGHTNING = "2.6"


def built_by_lightning_cli() -> bool:
    """Whether LightningCLI is instantiating a module right now (it hands its parsed config over as hyper-parameters).

    Private use: ``lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters``, the context variable that
    LightningCLI sets around model instantiation so that ``save_hyperparameters`` stores the config (class paths
    included) instead of the objects. No public API tells a module's ``__init__`` that it is being built by the CLI.
    Without the variable (another Lightning), modules built by the CLI fall back to ignoring objects, and
    ``load_from_checkpoint`` then needs the backbone passed in.
    """
    try:
        from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
    except ImportError:
        return False
    value: Any = _given_hyperparameters.get()
    return value is not None


REDUCED_KEYS: set[str] = set()
"""Every key :func:`already_reduced` was told of in this process: the values layerwise reduced itself."""

SAMPLER_ADVICE = r"Using `DistributedSampler` with the dataloaders\. During `trainer\.(validate|test)\(\)`"
"""The start of Lightning's advice that a multi-process validate/test "replicates some samples" (a regular expression
for ``warnings.filterwarnings``; ``lightning.pytorch.trainer.connectors.data_connector``, ``_resolve_sampler``).
Not a private API, but Lightning's own words, which layerwise withholds where its analysis is exact
(``layerwise/callbacks/_exactness.py``); ``tests/project/test_compat.py`` checks that Lightning still says them so."""


def already_reduced(keys: Any) -> None:
    """Tell Lightning that the epoch-level values logged under ``keys`` are already global (no sync advice for them).

    Private use: ``lightning.pytorch.trainer.connectors.logger_connector.result.warning_cache``, the de-duplication
    set of the warning "It is recommended to use `self.log(key, ..., sync_dist=True)` ..." that Lightning prints once
    per key under DDP for a value logged without ``sync_dist``. The callbacks log values reduced before (an
    all-reduce of their sum states) from host tensors, which ``sync_dist=True`` would all-reduce once more per key
    (and NCCL cannot reduce host tensors). No public API marks a logged value as already reduced; a message already
    in the set is not printed again. Without the module (another Lightning) the advice is printed as before.
    """
    REDUCED_KEYS.update(str(key) for key in keys)
    try:
        from lightning.pytorch.trainer.connectors.logger_connector.result import warning_cache
    except ImportError:
        return
    for key in keys:
        warning_cache.add(
            f"It is recommended to use `self.log({key!r}, ..., sync_dist=True)` when logging on epoch level in"
            " distributed setting to accumulate the metric across devices."
        )


def process_group_timeout(strategy: Any) -> Optional[str]:
    """The process group timeout a Lightning strategy was given (``0:30:00``), or None when it has none.

    Private use: ``DDPStrategy._timeout`` and ``ModelParallelStrategy._timeout`` (also FSDPStrategy's), where the
    ``timeout`` constructor argument is kept until the process group is made with it. No public property reads it
    back; the line a process says when a collective lost a peer (``layerwise/cli/peers.py``) names the value.
    """
    timeout = getattr(strategy, "_timeout", None)
    return str(timeout) if timeout is not None else None


def default_store() -> Any:
    """The key-value store of the default process group (a ``TCPStore`` hosted by global rank zero), or None.

    Private use: ``torch.distributed.distributed_c10d._get_default_store``. A rank that fails leaves its cause there
    (``layerwise/cli/peers.py``) so that rank zero, whose collective then loses it, can name it in one line; no public
    API hands out the store the process group was made with. Without it (another torch), the line says only that
    another rank ended.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store
    except ImportError:
        return None
    return _get_default_store()


CHECKED_TORCHMETRICS = "1.9"


class Float64StatesOnCast:
    """Mixin for a ``torchmetrics.Metric`` whose float64 sum states must survive a parent module's dtype cast.

    Private use: ``torch.nn.Module._apply`` as overridden by ``torchmetrics.Metric._apply(fn, exclude_state)``. Every
    ``.to``/``.cuda``/``.float`` of a parent module reaches the metric only through it, and torchmetrics guards just
    ``.half()``/``.float()``/``.double()``/``.bfloat16()``: a parent's ``.to(torch.bfloat16)`` (Lightning's
    "bf16-true" precision) would turn the float64 sums into bf16. No public hook sees the cast, so this override
    probes where ``fn`` sends a float64 tensor and, for a cast, moves the states to that device only.
    ``Metric.set_dtype`` (which sets ``_casting_dtype``) still casts. ``tests/project/test_compat.py`` checks the
    signature and the behaviour on the installed torchmetrics.
    """

    _casting_dtype = False

    def _apply(self, fn: Any, exclude_state: Any = "") -> Any:
        import torch

        probe = fn(torch.zeros((), dtype=torch.float64, device=self.device))  # type: ignore[attr-defined]
        if probe.dtype != torch.float64 and not self._casting_dtype:
            device = probe.device
            return super()._apply(lambda tensor: tensor.to(device), exclude_state)  # type: ignore[misc]
        return super()._apply(fn, exclude_state)  # type: ignore[misc]


def take_lightning_sigterm(trainer: Any) -> bool:
    """Whether Lightning's own SIGTERM handler caught a signal; cleared, so that its loops do not stop by themselves.

    Private use: ``Trainer._signal_connector.received_sigterm``, the flag Lightning's handler sets (its loops then raise
    ``SIGTERMException``, a ``SystemExit`` without a code: exit 0, nothing saved). A preemption that arrives before
    layerwise's handler is installed (:mod:`layerwise.cli.preemption`) is taken over through it. Without the flag
    (another Lightning): False, and such an early signal ends the fit as Lightning ends it.
    """
    connector = getattr(trainer, "_signal_connector", None)
    if not getattr(connector, "received_sigterm", False):
        return False
    connector.received_sigterm = False  # type: ignore[union-attr]  # found just above
    return True


def validates_after_this_batch(trainer: Any) -> bool:
    """Whether Lightning validates right after the training batch that just ended (``val_check_interval``).

    Private use: ``_TrainingEpochLoop._should_check_val_fx(data_fetcher)``, the decision the loop makes right after
    ``on_train_batch_end``; no public API says it. A preemption must not stop before such a validation (a resume
    would count it as done). Without it (another Lightning): False, the fit stops at that batch all the same.
    """
    loop = trainer.fit_loop
    try:
        return bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))
    except Exception:
        return False


def saves_sharded(strategy: Any) -> bool:
    """Whether ``strategy`` is Lightning's own ``ModelParallelStrategy`` (FSDP2) saving sharded checkpoint folders.

    Private use: ``ModelParallelStrategy._save_distributed_checkpoint``, where its ``save_distributed_checkpoint``
    argument (default True) is kept; no public property reads it back. A subclass that overrides ``save_checkpoint``
    saves its own way: False. Its sharded save writes ``meta.pt`` with ``torch.save`` into the final name, which
    ``layerwise.engines.checkpoint.save_sharded`` writes atomically instead. Without the attribute (another
    Lightning): False, and Lightning saves as it does.
    """
    try:
        from lightning.pytorch.strategies import ModelParallelStrategy
    except ImportError:
        return False
    if not isinstance(strategy, ModelParallelStrategy):
        return False
    if type(strategy).save_checkpoint is not ModelParallelStrategy.save_checkpoint:
        return False
    return getattr(strategy, "_save_distributed_checkpoint", None) is True
