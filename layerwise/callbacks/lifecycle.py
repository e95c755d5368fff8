"""The one lifecycle of an analysis callback: its metric, its JSON key and its figure; the rest happens here."""

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from torchmetrics import Metric

from layerwise.callbacks._drawing import FigureJob, wait_for_figures
from layerwise.callbacks._output import _log_dir, _run_id, log_figures_later, log_scalars, show, where, write_charts
from layerwise.callbacks._sampling import evaluation_loaders, real_samples_on_rank, take_real
from layerwise.callbacks._schedule import analyses_now, draws_figures
from layerwise.figures.summary import evaluation_figures, own_figures
from layerwise.metrics.sync import all_reduce_sum_states
from layerwise.results import loader_stages, merge_summary, summary_path, to_json

Layout = dict[str, dict[str, list]]
# One Custom Scalars layout per Trainer: TensorBoard shows the last one a run wrote, so every callback adds to it.
_LAYOUTS: "weakref.WeakKeyDictionary[Trainer, Layout]" = weakref.WeakKeyDictionary()


def add_charts(trainer: Trainer, layout: Layout) -> None:
    """Merge ``layout`` (category -> chart title -> chart) into the run's Custom Scalars and write it when it grew."""
    merged = _LAYOUTS.setdefault(trainer, {})
    grown = False
    for category, charts in layout.items():
        known = merged.setdefault(category, {})
        for title, chart in charts.items():
            grown |= known.get(title) != chart
            known[title] = chart
    if grown:
        write_charts(trainer, merged)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}={value!r}` must be a positive int.")


class AnalysisCallback(Callback):
    """Base of the analysis callbacks that report one JSON key per analysed evaluation and dataloader.

    The lifecycle, in order, on every rank unless said otherwise; the same for ``validate`` (stage ``val``) and
    ``test`` (stage ``test``), and for every evaluation dataloader (the first reported as the stage itself, the
    others as ``<stage>_<name>``, :func:`~layerwise.results.loader_stages`):

    1. ``on_{validation,test}_epoch_start``: is this evaluation analysed (never the sanity check; every
       ``every_n_epochs``-th epoch while fitting; always in ``validate``/``test``)?
    2. the first batch of each dataloader (Lightning evaluates them one after the other): the previous dataloader's
       report (step 3), then :attr:`stage` and :attr:`loader` set, the padding budget of this dataloader (how many
       of this rank's samples are real, not the ``DistributedSampler``'s repeats) and :meth:`start`.
    3. every batch: :meth:`before_batch` and :meth:`after_batch`; :meth:`real_rows` says how many rows of a batch
       count.
    4. after a dataloader's last batch (at the next one's first batch, or at ``on_{validation,test}_epoch_end``):
       :meth:`stop`, one all-reduce of the float64 sum states of :meth:`metrics` (layerwise's sum-state metrics; a
       plain torchmetrics ``Metric`` syncs itself in its ``compute``), :meth:`compute` (the global results), the
       :meth:`scalars` logged through Lightning as ``<stage>/<name>`` at ``trainer.global_step`` (already global:
       no sync) with their Custom Scalars :meth:`charts`; then on global rank zero the results, made JSON, merged
       under :attr:`key` into the epoch's summary (``<log_dir>/layerwise/<stage>_epoch_..._step_....json``), the
       console :meth:`line` with the summary's path, and the figures of the JSON results (:attr:`figures`, or the
       package's own), drawn in the drawing process off the training loop, when ``log_figures`` and the figure
       schedule say so.
    5. ``on_exception`` and ``teardown``: :meth:`stop`, and the figures already enqueued reach the logger first.

    A subclass sets :attr:`key` and overrides what it needs of :meth:`start`, :meth:`before_batch`,
    :meth:`after_batch`, :meth:`stop`, :meth:`metrics`, :meth:`compute`, :meth:`scalars`, :meth:`charts`,
    :meth:`line`, and sets :attr:`figures` to a module-level function of its JSON results; ``docs/callbacks.md``
    ("Add your own analysis") shows one, ``examples/feature_norm.py``.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` and ``test`` always do).
        log_figures: draw the figures as images in every logger (PNG files without one; global rank zero).
        figures_every_n_epochs: while fitting, draw them only every n-th epoch and at the last one (the schedule of
            :class:`~layerwise.callbacks.LayerwiseMonitor`); ``validate`` always draws.
    """

    key: ClassVar[str] = ""  # the JSON key of the results in the epoch's summary
    # A module-level function of the JSON results -> {name: matplotlib figure}, drawn in the drawing process (which
    # imports its module by name, and no torch unless that module does); None: the package's own figures of `key`
    # (layerwise.figures.summary.summary_figures, which `layerwise plot` draws from the summary file too).
    figures: ClassVar[Optional[Callable[[Any], dict[str, Any]]]] = None

    def __init__(self, every_n_epochs: int = 1, log_figures: bool = True, figures_every_n_epochs: int = 1) -> None:
        if not self.key:
            raise TypeError(f"{type(self).__name__} sets no `key`: the JSON key its results are written under.")
        _positive_int("every_n_epochs", every_n_epochs)
        _positive_int("figures_every_n_epochs", figures_every_n_epochs)
        self.every_n_epochs = every_n_epochs
        self.log_figures = log_figures
        self.figures_every_n_epochs = figures_every_n_epochs
        self._active = False
        self._budget: Optional[int] = None
        self._stages: list[str] = []
        self._loaders: list[Any] = []
        self._loader_index: Optional[int] = None
        self.stage = "val"  # the results' name: val, test, or val_<name> / test_<name> for a further dataloader
        self.loader: Any = None  # the evaluation dataloader being analysed

    # -- what an analysis implements ----------------------------------------------------------------------------

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """An analysed epoch begins: build or reset the metrics on the module's device, attach hooks."""

    def before_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any) -> None:
        """Before the module's validation step on ``batch``."""

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        """After it: feed the metrics with the :meth:`real_rows` of the batch."""

    def stop(self) -> None:
        """Release what :meth:`start` attached (end of the epoch, an exception, teardown; also when nothing is)."""

    def metrics(self) -> Sequence[Metric]:
        """The package's float64 sum-state metrics (``sync_on_compute=False``), summed in one all-reduce.

        A plain torchmetrics ``Metric`` need not be listed: it syncs its own states when :meth:`compute` calls its
        ``compute`` (``sync_on_compute=True``, torchmetrics' default), on every rank.
        """
        return ()

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        """The global results, stored under :attr:`key` as JSON: a dict of tensors, numbers and lists, or a list.

        Runs on every rank after the all-reduce of :meth:`metrics`; a collective of its own may run here.
        """
        raise NotImplementedError

    def scalars(self, results: Any) -> dict[str, float]:
        """Scalars to log, named without the stage (``"residual_ratio/block/layer_01"``)."""
        return {}

    def charts(self) -> dict[str, str]:
        """TensorBoard multi-line charts: title -> regex of scalar names without the stage (all layers of one)."""
        return {}

    def line(self, results: Any) -> str:
        """One console line on the JSON results (global rank zero; the summary's path is appended)."""
        return f"{self.key} of {type(self).__name__}"

    # -- the lifecycle ------------------------------------------------------------------------------------------

    def real_rows(self, size: int) -> int:
        """How many of the ``size`` rows of the current batch count: this rank's real samples of its dataloader."""
        rows, self._budget = take_real(self._budget, size)
        return rows

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, "val", trainer.val_dataloaders)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, "test", trainer.test_dataloaders)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._before(trainer, pl_module, batch, dataloader_idx)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._active:
            self.after_batch(trainer, pl_module, outputs, batch)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end(trainer, pl_module)

    # test batches and its epoch's end go through the same steps as validation's
    on_test_batch_start = on_validation_batch_start
    on_test_batch_end = on_validation_batch_end
    on_test_epoch_end = on_validation_epoch_end

    def _begin(self, trainer: Trainer, stage: str, dataloaders: Any) -> None:
        self.stop()
        self._active = analyses_now(trainer, self.every_n_epochs)
        self._stages = loader_stages(stage, dataloaders)
        self._loaders = evaluation_loaders(dataloaders)
        self._loader_index = None

    def _before(self, trainer: Trainer, pl_module: LightningModule, batch: Any, dataloader_idx: int) -> None:
        if not self._active:
            return
        if dataloader_idx != self._loader_index:  # Lightning evaluates its dataloaders one after the other
            if self._loader_index is not None:
                self.stop()
                self._report(trainer, pl_module)
            self._loader_index = dataloader_idx
            self.stage = self._stages[dataloader_idx]
            self.loader = self._loaders[dataloader_idx]
            self._budget = real_samples_on_rank(self.loader)
            self.start(trainer, pl_module)
        self.before_batch(trainer, pl_module, batch)

    def _end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        active, self._active = self._active, False
        if not active or self._loader_index is None:
            return
        self._loader_index = None
        self.stop()
        self._report(trainer, pl_module)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it
        self.stop()
        self._active, self._loader_index = False, None

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it
        self.stop()

    def _report(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Reduce, compute, log (every rank: collectives); write, print and draw (global rank zero)."""
        all_reduce_sum_states(list(self.metrics()))
        results = self.compute(trainer, pl_module)
        scalars = {f"{self.stage}/{name}": value for name, value in self.scalars(results).items()}
        log_scalars(trainer, pl_module, scalars)  # already global: no sync, no collective per scalar
        log_dir = _log_dir(trainer)  # a broadcast under DDP: every rank asks
        if not trainer.is_global_zero:
            return
        stage = self.stage
        charts = {f"{stage} {title}": ["Multiline", [f"{stage}/{regex}"]] for title, regex in self.charts().items()}
        if charts:
            add_charts(trainer, {f"layerwise {stage}": charts})
        written = to_json(results)
        # No "layers"/"depth": they are the LayerwiseMonitors' layer selection, which this must not overwrite.
        header = {"stage": self.stage, "epoch": trainer.current_epoch, "global_step": trainer.global_step}
        path = summary_path(log_dir, self.stage, trainer.current_epoch, trainer.global_step)
        merge_summary(path, {**header, self.key: written}, _run_id(trainer))
        show(trainer, " ".join(part for part in (self.line(written), where(trainer, path)) if part))
        if draws_figures(trainer, self.log_figures, self.figures_every_n_epochs):
            summary = {**header, self.key: written}
            own = inspect.getattr_static(type(self), "figures")
            own = getattr(own, "__func__", own)  # a staticmethod's function
            if own is None:
                log_figures_later(trainer, FigureJob(evaluation_figures, (stage, summary)), stamp=False)
            else:
                log_figures_later(trainer, FigureJob(own_figures, (own, stage, summary, self.key)), stamp=False)
