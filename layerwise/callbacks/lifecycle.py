"""The one lifecycle of the analysis callbacks: each says its metric, its results and its figure; the rest is here."""

import inspect
import re
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import Metric

from layerwise.callbacks._drawing import FigureJob, wait_for_figures
from layerwise.callbacks._exactness import say_counted_once, warn_repeated_own_logs, withhold_sampler_advice
from layerwise.callbacks._loggers import (
    History,
    LayerRuns,
    chart_loggers,
    custom_scalars_regex,
    log_layer_charts,
    log_tensorboard_charts,
)
from layerwise.callbacks._output import log_figures_later, log_scalars, run_log_dir, show, write_charts
from layerwise.callbacks._schedule import analyses_now, draws_figures, last_step_unvalidated
from layerwise.engines.checkpoint import evaluate_at, read_position
from layerwise.engines.sampling import evaluation_loaders, real_samples_on_rank, take_real
from layerwise.errors import LayerwiseWarning
from layerwise.figures.registry import FIGURE_FUNCTIONS, FigureFunction, recorded
from layerwise.figures.summary import evaluation_figures
from layerwise.metrics.sync import all_reduce_sum_states
from layerwise.results import loader_stages, merge_summary, summary_path, to_json

Layout = dict[str, dict[str, list]]
RUN_KEY = "layerwise_run"  # a checkpoint's record of its run: the summaries' run id and the scalars' history


@dataclass
class RunRecord:
    """What the analysis callbacks of one run share, held by the first of them in ``trainer.callbacks``.

    ``run_id``: every callback of the run writes into the same per-evaluation summary under it (a file of another run
    is moved aside, :func:`~layerwise.results.merge_summary`); ``shown``: the summary paths already printed (the
    console names each once); ``layout``: the Custom Scalars layout every callback adds its charts to (TensorBoard
    shows the last one a run wrote); ``history``: per stage, the scalars of every analysed evaluation so far, for the
    per-layer line plots of W&B and TensorBoard's chart images; ``layer_runs``: TensorBoard's run per layer, where
    the per-layer scalars are written for a line per layer on one chart (closed at teardown and on an exception).
    """

    trainer: "weakref.ref[Trainer]"
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    shown: set[str] = field(default_factory=set)
    layout: Layout = field(default_factory=dict)
    history: dict[str, History] = field(default_factory=dict)
    layer_runs: LayerRuns = field(default_factory=LayerRuns)

    def where(self, path: Any) -> str:
        """``"-> path"`` the first time a summary path is shown in this run, ``""`` after (one arrow, one mention)."""
        if str(path) in self.shown:
            return ""
        self.shown.add(str(path))
        return f"-> {path}"

    def add_charts(self, trainer: Trainer, layout: Layout) -> None:
        """Merge ``layout`` (category -> chart title -> chart) into the run's and write it when it grew."""
        grown = False
        for category, charts in layout.items():
            known = self.layout.setdefault(category, {})
            for title, chart in charts.items():
                grown |= known.get(title) != chart
                known[title] = chart
        if grown:
            write_charts(trainer, self.layout)

    def add_history(self, stage: str, step: int, scalars: dict[str, Any]) -> History:
        """Append one analysed evaluation's scalars (tag -> value) to the stage's history, and return that history."""
        history = self.history.setdefault(stage, {})
        for tag, value in scalars.items():
            history.setdefault(tag, []).append((step, float(value)))
        return history


def positive_int(name: str, value: Any) -> None:
    """Refuse `value` unless it is an int >= 1 (a bool is not), naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}={value!r}` must be a positive int.")


class AnalysisCallback(Callback):
    """Base of every analysis callback: the one description of when an analysis runs and where its results go.

    The lifecycle, in order, on every rank unless said otherwise; the same for ``validate`` (stage ``val``) and
    ``test`` (stage ``test``), and for every evaluation dataloader (the first reported as the stage itself, the
    others as ``<stage>_<name>``, :func:`~layerwise.results.loader_stages`):

    0. ``setup`` of ``validate``/``test`` on several processes: Lightning's advice to evaluate on one device is
       withheld (the analysis counts each sample once) and, at ``on_{validation,test}_start``, one line says so;
       after it (``teardown``), values the module logged itself with ``self.log`` that counted the sampler's
       repeated samples are named in a warning (``callbacks/_exactness.py``). ``on_{validation,test}_start`` of
       ``validate``/``test`` with a ``ckpt_path``: the Trainer's epoch and step counters are the checkpoint's while
       it evaluates (put back after), so the summary is named by them as in ``layerwise validate``. Both by the
       first analysis callback of the trainer only; a subclass that overrides ``setup`` calls ``super().setup``.
       ``on_train_start``: a warning when ``max_steps`` ends a fit between two validations (the final model would
       not be analysed).
    1. ``on_{validation,test}_epoch_start``: is this evaluation analysed (never the sanity check; every
       ``every_n_epochs``-th epoch while fitting; always in ``validate``/``test``)?
    2. the first batch of each dataloader (Lightning evaluates them one after the other): the previous dataloader's
       report (step 4), then :attr:`stage`, :attr:`loader` and :attr:`dataloader_idx` set, the padding budget of
       this dataloader (how many of this rank's samples are real, not the ``DistributedSampler``'s repeats) and
       :meth:`start`.
    3. every batch: :meth:`before_batch` and :meth:`after_batch`; :meth:`real_rows` says how many rows of a batch
       count.
    4. after a dataloader's last batch (at the next one's first batch, or at ``on_{validation,test}_epoch_end``):
       :meth:`stop`, one all-reduce of the float64 sum states of :meth:`metrics` (layerwise's sum-state metrics; a
       plain torchmetrics ``Metric`` syncs itself in its ``compute``), :meth:`compute` (the global results), the
       :meth:`scalars` logged through Lightning as ``<stage>/<name>`` at ``trainer.global_step`` (already global:
       no sync); then on global rank zero their Custom Scalars :meth:`charts` (those with a logged scalar), the
       per-layer scalars (``.../layer_XX``) in TensorBoard's run of each layer, the results made JSON and merged
       into the evaluation's summary (``<log_dir>/layerwise/<stage>_epoch_..._step_....json``) as
       :meth:`summary_entries` (under :attr:`key`) with the :meth:`figure_functions` that draw them (the summary's
       registry of its figures, ``layerwise.figures.registry``), the console :meth:`line` with the summary's path,
       and, when ``log_figures`` and the figure schedule say so, those figures drawn in the drawing process off the
       training loop by the function ``layerwise plot`` and ``report`` draw the summary file with, with the per-layer
       line plots of W&B and TensorBoard's chart images of the :meth:`charts` over the run so far.
    5. ``on_exception`` and ``teardown``: :meth:`stop`, the figures already enqueued reach the logger first, and
       the layer runs' writers are flushed and closed.

    A checkpoint keeps the run's id and the scalars' history (``layerwise_run``): a resumed fit writes its summaries
    under the same id and draws its charts over the whole run.

    What the callbacks of one run share (the summary's run id, the paths shown, the charts' layout, the scalars'
    history) is a :class:`RunRecord` held by the first analysis callback of the trainer, not module state.

    A subclass sets :attr:`key` and overrides what it needs of :meth:`start`, :meth:`before_batch`,
    :meth:`after_batch`, :meth:`stop`, :meth:`metrics`, :meth:`compute`, :meth:`scalars`, :meth:`charts`,
    :meth:`line`, and sets :attr:`figures` to a module-level function of its JSON results. The package's callbacks
    are its subclasses: what is not per layer (``compare``, ``coupling``, ``residual``, ``detection``) and
    :class:`~layerwise.callbacks.LayerwiseAnalysis`, which runs the per-layer analyses (plain objects,
    :mod:`layerwise.analyses`: the extension API, ``docs/callbacks.md``'s "Add your own analysis").

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` and ``test`` always do).
        log_figures: draw the figures as images in every logger (PNG files without one; global rank zero).
        figures_every_n_epochs: while fitting, draw them only every n-th analysed epoch and at the last one;
            ``validate`` and ``test`` always draw.
    """

    key: ClassVar[str] = ""  # the JSON key of the results in the epoch's summary
    _resumed: dict[str, Any] = {}  # the run record's state from a checkpoint (load_state_dict)
    # A module-level function of the JSON results -> {name: matplotlib figure}, drawn in the drawing process (which
    # imports its module by name, and no torch unless that module does) and named in the summary; `layerwise plot`
    # and `report` draw it again from the file once it is registered (the entry-point group `layerwise.figures`, or
    # `--figures module:function`: layerwise.figures.registry); None: no figure.
    # (set as `figures = staticmethod(function)`)
    figures: ClassVar[Any] = None

    def __init__(self, every_n_epochs: int = 1, log_figures: bool = True, figures_every_n_epochs: int = 1) -> None:
        if not self.key and type(self).summary_entries is AnalysisCallback.summary_entries:
            raise TypeError(f"{type(self).__name__} sets no `key`: the JSON key its results are written under.")
        positive_int("every_n_epochs", every_n_epochs)
        positive_int("figures_every_n_epochs", figures_every_n_epochs)
        self.every_n_epochs = every_n_epochs
        self.log_figures = log_figures
        self.figures_every_n_epochs = figures_every_n_epochs
        self._active = False
        self._budget: Optional[int] = None
        self._stages: list[str] = []
        self._loaders: list[Any] = []
        self._record: Optional[RunRecord] = None
        self._advice_withheld: Optional[str] = None  # the evaluation whose sampler advice this callback withheld
        self._evaluated_counters: Optional[dict[str, Any]] = None  # the Trainer's own, put back after a checkpoint
        self.stage = "val"  # the results' name: val, test, or val_<name> / test_<name> for a further dataloader
        self.loader: Any = None  # the evaluation dataloader being analysed
        self.dataloader_idx: Optional[int] = None  # its index (None between evaluations)

    # -- what an analysis implements ----------------------------------------------------------------------------

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """An analysed dataloader begins: build or reset the metrics on the module's device, attach hooks."""

    def before_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any) -> None:
        """Before the module's validation step on ``batch``."""

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        """After it: feed the metrics with the :meth:`real_rows` of the batch."""

    def stop(self) -> None:
        """Release what :meth:`start` attached (a dataloader's end, an exception, teardown; also when nothing is)."""

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
        """Multi-line charts: title -> regex of scalar names without the stage (all layers of one quantity)."""
        return {}

    def line(self, results: Any) -> str:
        """The console text on the JSON results (global rank zero; the summary's path is added; "": none)."""
        return f"{self.key} of {type(self).__name__}"

    def summary_entries(self, results: Any) -> dict[str, Any]:
        """What the JSON results add to the evaluation's summary: ``{key: results}``."""
        return {self.key: results}

    def figure_functions(self) -> list[tuple[FigureFunction, Optional[str]]]:
        """The figure functions of the results with the summary key each reads: :attr:`figures` of :attr:`key`."""
        own = inspect.getattr_static(type(self), "figures")
        own = getattr(own, "__func__", own)  # a staticmethod's function
        return [] if own is None else [(own, self.key or None)]

    # -- the lifecycle ------------------------------------------------------------------------------------------

    def real_rows(self, size: int) -> int:
        """How many of the ``size`` rows of the current batch count: this rank's real samples of its dataloader."""
        rows, self._budget = take_real(self._budget, size)
        return rows

    def run_record(self, trainer: Trainer) -> RunRecord:
        """The :class:`RunRecord` of ``trainer``'s run, held by its first analysis callback (made on first use)."""
        callbacks = getattr(trainer, "callbacks", ())  # Lightning's connector sets it (none on a trainer not built)
        first = next((other for other in callbacks if isinstance(other, AnalysisCallback)), self)
        if first._record is None or first._record.trainer() is not trainer:
            resumed = {key: first._resumed[key] for key in ("run_id", "history") if key in first._resumed}
            first._record = RunRecord(weakref.ref(trainer), **resumed)
        self._record = first._record
        return first._record

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """What a resumed fit continues: the run's id in its summaries and the scalars' history (its charts).

        In the checkpoint's own key (the run's, shared by its callbacks), not as a callback state: an evaluation
        configured without this callback is then not warned by Lightning that a callback of the checkpoint is missing.
        """
        record = self._record  # global rank zero's, which the checkpoint keeps
        if record is not None:
            checkpoint[RUN_KEY] = {"run_id": record.run_id, "history": record.history}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # an evaluation of the checkpoint is a run of its own
            self._resumed = dict(checkpoint.get(RUN_KEY) or {})

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        last = last_step_unvalidated(trainer)
        if last is not None:
            rank_zero_warn(
                f"{type(self).__name__}: training stops at max_steps={trainer.max_steps} but the last validation runs "
                f"at step {last}, so the final model is not analysed. Make max_steps x accumulate_grad_batches a "
                "multiple of val_check_interval (with check_val_every_n_epoch: null).",
                category=LayerwiseWarning,
            )

    def _leads(self, trainer: Trainer) -> bool:
        """Whether this is the first analysis callback of ``trainer``: what the run does once, it does."""
        callbacks = getattr(trainer, "callbacks", ())  # Lightning's connector sets it (none on a trainer not built)
        return next((other for other in callbacks if isinstance(other, AnalysisCallback)), None) is self

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Lightning's sampler advice withheld in a multi-process ``validate``/``test`` (the first callback only)."""
        self._advice_withheld = stage if self._leads(trainer) and withhold_sampler_advice(trainer, stage) else None

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._evaluation_start(trainer, "validate")

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._evaluation_start(trainer, "test")

    def _evaluation_start(self, trainer: Trainer, stage: str) -> None:
        if trainer.state.fn not in (TrainerFn.VALIDATING, TrainerFn.TESTING) or not self._leads(trainer):
            return  # a fit's validation, or another callback does it
        if self._advice_withheld == stage:
            say_counted_once(trainer, stage)
        position = read_position(trainer.ckpt_path) if trainer.ckpt_path else None
        if position is not None and self._evaluated_counters is None:
            self._evaluated_counters = evaluate_at(trainer, position)

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
        self.dataloader_idx = None

    def _before(self, trainer: Trainer, pl_module: LightningModule, batch: Any, dataloader_idx: int) -> None:
        if not self._active:
            return
        if dataloader_idx != self.dataloader_idx:  # Lightning evaluates its dataloaders one after the other
            if self.dataloader_idx is not None:
                self.stop()
                self._report(trainer, pl_module)
            self.dataloader_idx = dataloader_idx
            self.stage = self._stages[dataloader_idx]
            self.loader = self._loaders[dataloader_idx]
            self._budget = real_samples_on_rank(self.loader)
            self.start(trainer, pl_module)
        self.before_batch(trainer, pl_module, batch)

    def _end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        active, self._active = self._active, False
        if not active or self.dataloader_idx is None:
            return
        self.stop()
        self._report(trainer, pl_module)
        self.dataloader_idx = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it
        self.stop()
        self._active, self.dataloader_idx = False, None
        self._close_layer_runs()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it
        self.stop()
        self._close_layer_runs()
        if self._advice_withheld == stage:
            warn_repeated_own_logs(trainer, stage)
        counters, self._advice_withheld, self._evaluated_counters = self._evaluated_counters, None, None
        if counters is not None:  # the Trainer's own counters again (a fit after this evaluation goes on from them)
            trainer.fit_loop.load_state_dict(counters)

    def _close_layer_runs(self) -> None:
        if self._record is not None:  # a record exists on global rank zero only (made in its report)
            self._record.layer_runs.close()

    def _report(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Reduce, compute, log (every rank: collectives); write, print and draw (global rank zero)."""
        all_reduce_sum_states(list(self.metrics()))
        results = self.compute(trainer, pl_module)
        scalars = {f"{self.stage}/{name}": value for name, value in self.scalars(results).items()}
        log_scalars(trainer, pl_module, scalars)  # already global: no sync, no collective per scalar
        log_dir = run_log_dir(trainer)  # a broadcast under DDP: every rank asks
        if not trainer.is_global_zero:
            return
        record, stage, step = self.run_record(trainer), self.stage, trainer.global_step
        charts = {title: f"{stage}/{regex}" for title, regex in self.charts().items()}
        charts = {title: regex for title, regex in charts.items() if any(re.fullmatch(regex, tag) for tag in scalars)}
        if charts:  # only charts with a scalar: no empty chart (no perplexity of a vision model)
            layout = {
                f"{stage} {title}": ["Multiline", [custom_scalars_regex(regex, list(scalars))]]
                for title, regex in charts.items()
            }
            record.add_charts(trainer, {f"layerwise {stage}": layout})
        record.layer_runs.log(trainer, scalars, step)
        written = to_json(results)
        header = {"stage": stage, "epoch": trainer.current_epoch, "global_step": step}
        functions = self.figure_functions()
        summary = {**header, **self.summary_entries(written), FIGURE_FUNCTIONS: recorded(functions)}
        path = summary_path(log_dir, stage, trainer.current_epoch, step)
        merge_summary(path, summary, record.run_id)
        text = self.line(written)
        if text:  # a table ends with the path on a line of its own, a line with it
            note = record.where(path)
            show(trainer, (text + ("\n" if "\n" in text else " ") + note) if note else text)
        history = record.add_history(stage, step, scalars) if chart_loggers(trainer) else {}
        if not draws_figures(trainer, self.log_figures, self.figures_every_n_epochs):
            return
        if functions:  # the function `plot` draws the summary with, given this process's own function objects: the
            # drawing process draws what this code registered, never a name read from a file
            drawn = tuple(function for function, _ in functions)
            log_figures_later(trainer, FigureJob(evaluation_figures, (stage, summary, drawn)))
        if charts and history:
            log_layer_charts(trainer, stage, charts, history)
            log_tensorboard_charts(trainer, stage, charts, history)
