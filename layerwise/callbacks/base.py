"""LayerwiseMonitor, the callback of the per-layer metric families: when to analyse, what to feed, what to report.

What one evaluation dataloader accumulates and how it reduces lives in ``_loader.py``, where the features come from
in ``_source.py``, where the results go in ``_output.py``.
"""

import copy
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from layerwise.callbacks._drawing import wait_for_figures
from layerwise.callbacks._loader import LoaderState
from layerwise.callbacks._output import (
    _log_dir,
    chart_layout,
    layer_table,
    log_figures,
    log_scalars,
    show,
    where,
    write_summary,
)
from layerwise.callbacks._sampling import evaluation_loaders
from layerwise.callbacks._schedule import analyses_now, draws_figures, last_step_unvalidated
from layerwise.callbacks._source import FeatureSource
from layerwise.callbacks.family import Family, LayerBatch, LayerSpec, per_layer
from layerwise.callbacks.lifecycle import add_charts
from layerwise.errors import LayerwiseWarning, UsageError
from layerwise.features.layers import LayerSelection, select_layers
from layerwise.results import loader_stages

Source = Literal["auto", "outputs", "hooks"]
__all__ = ["Family", "LayerBatch", "LayerSpec", "LayerwiseMonitor", "per_layer"]


class LayerwiseMonitor(Callback):
    """Base of the analysis callbacks: feeds metric families with every validation (and test) batch.

    Features come from the module's ``validation_step`` output when it follows the contract of
    :mod:`layerwise.features.outputs` (every :class:`~layerwise.lightning_modules.LayerwiseModule` does), or from
    forward hooks on the blocks of any other model (``source="hooks"``; paths from the built-in table for timm ViTs
    and Hugging Face BERT/GPT-2/LLaMA, or from ``blocks``/``final_norm``/``classifier``). Hooks live only during
    the evaluation epoch and are always removed, also when the run fails.

    Exactness under DDP: every rank feeds only its own real samples (the padding that ``DistributedSampler`` adds
    to even out an uneven validation set is dropped), all metric states are summed with one all-reduce, and every
    rank computes the same result. Figures and the JSON summary are written on global rank zero.

    Several evaluation dataloaders (e.g. a distribution-shifted validation set next to the clean one) are analysed
    separately, each with its own metrics: the first is reported as ``val`` (``test``), every other one as
    ``val_<name>`` — its key when ``val_dataloader`` returns a dict, else its index — in its own JSON summary
    (``val_<name>_epoch_...json``), scalars (``val_<name>/acc/layer_XX``) and figures.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate``/``test`` always analyse).
        layers: which layers: None = all, int n = the last n, list = 0-based block indices (negatives allowed).
        save_features: also write ``<log_dir>/layerwise/<stage>_epoch_<EEE>_features.pt`` with ``features``
            (L x N x d float32), ``labels`` (N), ``predictions`` (L x N) and ``max_prob`` (L x N). Holds the
            evaluated features in CPU memory for the epoch.
        print_table: print a per-layer table (accuracy, COS/CKA to the last layer, NC1) and the summary's path at
            the end of every analysed validation (global rank zero only).
        log_figures: draw heatmaps/histograms as images in every logger (PNG files without one; global rank zero only).
        figures_every_n_epochs: while fitting, draw them only every n-th analysed epoch and at the last epoch
            (default every epoch: the figures are drawn by a background thread off the training loop,
            ``callbacks/_drawing.py``; the JSON of every epoch holds everything ``layerwise plot`` draws).
            ``validate``/``test`` always draw.
        source: ``"outputs"`` reads the step's returned dict, ``"hooks"`` attaches forward hooks; ``"auto"`` uses hooks
            when paths are given or the module is not a layerwise module, else the outputs.
        blocks, final_norm, classifier: dotted paths, relative to the LightningModule, of the block list, the final
            norm(s) and the classifier module(s) (applied in order); only for the hook source.
        pooling: ``"cls"``, ``"mean"`` or ``"last"`` token of each block output (hook source; default from the table).
        token_stride: language models: COS, CKA and the saturation COS use only positions ``t`` with
            ``t % token_stride == 0`` (a subsample that does not depend on batching or the number of processes);
            accuracy, loss, saturation counts and early exit always use every token.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        layers: LayerSelection = None,
        save_features: bool = False,
        print_table: bool = True,
        log_figures: bool = True,
        figures_every_n_epochs: int = 1,
        source: Source = "auto",
        blocks: Optional[str] = None,
        final_norm: Union[str, list[str], None] = None,
        classifier: Union[str, list[str], None] = None,
        pooling: Optional[Literal["cls", "mean", "last"]] = None,
        token_stride: int = 1,
    ) -> None:
        if token_stride < 1:
            raise ValueError(f"`token_stride={token_stride}` must be >= 1.")
        if figures_every_n_epochs < 1:
            raise ValueError(f"`figures_every_n_epochs={figures_every_n_epochs}` must be >= 1.")
        if every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs={every_n_epochs}` must be >= 1.")
        if source not in ("auto", "outputs", "hooks"):
            raise ValueError(f"`source={source!r}` must be 'auto', 'outputs' or 'hooks'.")
        if pooling is not None and pooling not in ("cls", "mean", "last"):
            raise ValueError(f"`pooling={pooling!r}` must be 'cls', 'mean' or 'last'.")
        self.every_n_epochs = every_n_epochs
        self.layers = layers
        self.save_features = save_features
        self.print_table = print_table
        self.log_figures = log_figures
        self.figures_every_n_epochs = figures_every_n_epochs
        self.source = source
        self.hook_paths = {"blocks": blocks, "final_norm": final_norm, "classifier": classifier, "pooling": pooling}
        self._source = FeatureSource(source, self.hook_paths)
        self.token_stride = token_stride
        self.families: list[Family] = []
        self._stage: Optional[str] = None
        self._spec: Optional[LayerSpec] = None
        self._states: list[LoaderState] = []  # one per evaluation dataloader
        self._stages: list[str] = []
        self._charts_logged: dict[str, list[str]] = {}

    # -- when ---------------------------------------------------------------------------------------------------

    def _should_run(self, trainer: Trainer) -> bool:
        return analyses_now(trainer, self.every_n_epochs)

    def _draws_figures(self, trainer: Trainer) -> bool:
        return draws_figures(trainer, self.log_figures, self.figures_every_n_epochs)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for other in trainer.callbacks:
            if isinstance(other, LayerwiseMonitor) and other is not self and other.layers != self.layers:
                raise UsageError(
                    f"{type(self).__name__}(layers={self.layers!r}) and {type(other).__name__}(layers="
                    f"{other.layers!r}) would write one summary with different layers: give every layerwise callback "
                    "the same `layers`, or use one LayerwiseAnalysis."
                )
        depth = self._source.depth(pl_module)  # before any work: a bad selection must not cost a training run
        try:
            select_layers(self.layers, depth)
        except ValueError as error:
            raise UsageError(f"{type(self).__name__}: {error}") from None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        last = last_step_unvalidated(trainer)
        if last is not None:
            rank_zero_warn(
                f"{type(self).__name__}: training stops at max_steps={trainer.max_steps} but the last validation runs "
                f"at step {last}, so the final model is not analysed. Make max_steps x accumulate_grad_batches a "
                "multiple of val_check_interval (with check_val_every_n_epoch: null).",
                category=LayerwiseWarning,
            )

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, pl_module, "val", trainer.val_dataloaders)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, pl_module, "test", trainer.test_dataloaders)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._source.before_batch(batch)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._source.before_batch(batch)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs, batch, dataloader_idx)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs, batch, dataloader_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        wait_for_figures()  # the figures already enqueued reach the logger before Lightning closes it
        self._source.detach()
        self._stage = None
        for state in self._states:
            state.reset()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wait_for_figures()  # every figure of the run is logged before Lightning finalises the loggers
        self._source.detach()

    def _begin(self, trainer: Trainer, pl_module: LightningModule, stage: str, dataloaders: Any) -> None:
        self._source.detach()
        self._stage = stage if self._should_run(trainer) else None
        if self._stage is None:
            return
        loaders = evaluation_loaders(dataloaders)
        self._stages = loader_stages(stage, dataloaders)
        self._source.attach(pl_module)
        self._build(pl_module, len(loaders))
        for state, loader in zip(self._states, loaders):
            state.start(loader, keep_indices=self.save_features and trainer.world_size > 1)

    def _build(self, pl_module: LightningModule, num_loaders: int) -> None:
        depth, dim, num_classes, token_level = self._source.dims(pl_module)
        numbers = [index + 1 for index in select_layers(self.layers, depth)]
        spec = LayerSpec(numbers, depth, dim, num_classes, token_level)
        if spec != self._spec or len(self._states) != num_loaders:
            for family in self.families:
                family.configure(pl_module.trainer, spec)
            self._spec = spec
            self._states = []
            for index in range(num_loaders):
                # the first loader feeds the callback's own families; every other one a copy (a deep copy of the
                # list keeps the links between families, e.g. effective depth reading the logit lens's accuracy)
                families = self.families if index == 0 else copy.deepcopy(self.families)
                self._states.append(LoaderState.build(families, spec))
            self._selection = torch.tensor([number - 1 for number in numbers])
        self._selection = self._selection.to(pl_module.device)  # once, not a host-to-device copy at every batch
        for state in self._states:  # already zero: fresh, or reset when the last epoch finished or failed
            for metric in state.metrics:
                metric.to(pl_module.device)

    def _collect(self, outputs: Any, batch: Any, dataloader_idx: int) -> None:
        if self._stage is None:
            return
        outputs = self._source.outputs(outputs, batch)
        self._states[dataloader_idx].collect(outputs, self._selection, self.token_stride, self.save_features)

    # -- results --------------------------------------------------------------------------------------------------

    def _finish(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stage, self._stage = self._stage, None
        self._source.detach()
        if stage is None:
            return
        log_dir = _log_dir(trainer)  # a collective (trainer.log_dir broadcasts from rank 0): every rank calls it
        for name, state in zip(self._stages, self._states):
            self._report(trainer, pl_module, name, state, log_dir)

    def _report(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, state: LoaderState, log_dir: str
    ) -> None:
        """Reduce, compute, log and write the results of one evaluation dataloader (collectives: every rank)."""
        spec = self._spec
        num_samples, results = state.reduce(spec, stage, type(self).__name__)
        scalars = {
            f"{stage}/{key}": value for family in state.families for key, value in family.scalars(results, spec).items()
        }
        self._log_scalars(trainer, pl_module, scalars)
        if trainer.is_global_zero:
            results["n_nonfinite"] = int(state.nonfinite.rows)
            written, summary = write_summary(trainer, log_dir, stage, spec, num_samples, results)
            if self.print_table:
                table = layer_table(stage, trainer.current_epoch, trainer.global_step, results, spec)
                note = where(trainer, written)
                show(trainer, f"{table}\n{note}" if note else table)
            if self._draws_figures(trainer):
                log_figures(trainer, stage, state.families, summary, spec)
        if self.save_features:
            state.saver.write(trainer, stage, log_dir)
        state.reset()

    def _log_scalars(self, trainer: Trainer, pl_module: LightningModule, scalars: dict[str, float]) -> None:
        log_scalars(trainer, pl_module, scalars)
        stage = next(iter(scalars), "val").split("/")[0]
        if trainer.is_global_zero and stage not in self._charts_logged:
            self._charts_logged[stage] = list(scalars)
            add_charts(trainer, chart_layout(self._charts_logged, self.families))
