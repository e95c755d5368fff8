"""LayerwiseMonitor: the per-layer analyses on the one lifecycle of the analysis callbacks.

When it runs and where its results go is :class:`~layerwise.callbacks.lifecycle.AnalysisCallback`'s; here: what a
per-layer analysis declares (its metrics, its results, its scalars, charts and figure), where the features come from
(``_source.py``), what one evaluation dataloader accumulates and how it reduces (``_loader.py``), and the analyses'
results as the summary's top-level keys.
"""

import inspect
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from torchmetrics import Metric

from layerwise.callbacks._loader import LoaderState
from layerwise.callbacks._output import layer_table, run_log_dir
from layerwise.callbacks._source import FeatureSource
from layerwise.callbacks.layer_spec import LayerSpec, per_layer
from layerwise.callbacks.lifecycle import AnalysisCallback, positive_int
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import UsageError
from layerwise.features.layers import LayerSelection, select_layers
from layerwise.figures.registry import FigureFunction
from layerwise.results import evaluated_split

Source = Literal["auto", "outputs", "hooks"]
Metrics = dict[str, Metric]  # one analysis's metrics for one evaluation dataloader, by its own names
__all__ = ["LayerOutputs", "LayerSpec", "LayerwiseMonitor", "Metrics", "per_layer"]


class LayerwiseMonitor(AnalysisCallback):
    """Base of the per-layer analyses: metrics fed with the features and readout of every layer of every batch.

    An :class:`~layerwise.callbacks.lifecycle.AnalysisCallback` (its docstring is the order of the hooks: every
    evaluation stage and dataloader, the all-reduce, the summary, the figures), whose results are the summary's
    top-level keys (``layers``, ``depth``, ``num_samples``, ``n_nonfinite``, and each analysis's, e.g. ``cos``,
    ``accuracy``).

    A per-layer analysis is one subclass that declares its own options in its ``__init__`` (the monitor's through
    ``**kwargs``) and says, per evaluation dataloader, its metrics (:meth:`build`, :meth:`update`), its results
    (:meth:`results`, top-level keys of the summary), its scalars and charts (:meth:`layer_scalars`,
    :meth:`layer_charts`) and its figure (:attr:`figures`, a module-level function of the summary). On its own it
    runs as a callback; :class:`~layerwise.callbacks.LayerwiseAnalysis` runs several (:attr:`analyses`) on one
    feature source, one group of batches and one all-reduce.

    Features come from the module's ``validation_step`` output when it is a
    :class:`~layerwise.engines.readout.LayerOutputs` (every :class:`~layerwise.lightning_modules.LayerwiseModule`
    returns one), or from
    forward hooks on the blocks of any other model (``source="hooks"``; paths from the built-in table for timm ViTs
    and Hugging Face BERT/GPT-2/LLaMA, or from ``blocks``/``final_norm``/``classifier``). Hooks live only while a
    dataloader is analysed and are always removed, also when the run fails.

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
        save_features: also write ``<log_dir>/layerwise/<stage>_epoch_<EEE>_step_<SSSSSSS>_features.pt`` with
            ``features`` (L x N x d float32), ``labels`` (N), ``predictions`` (L x N) and ``max_prob`` (L x N).
            Holds the evaluated features in CPU memory for the epoch.
        print_table: print a per-layer table (accuracy, COS/CKA to the last layer, NC1) and the summary's path at
            the end of every analysed validation (global rank zero only).
        log_figures: draw heatmaps/histograms as images in every logger (PNG files without one; global rank zero only).
        figures_every_n_epochs: while fitting, draw them only every n-th analysed epoch and at the last epoch
            (default every epoch: the figures are drawn off the training loop, ``callbacks/_drawing.py``; the JSON of
            every epoch holds everything ``layerwise plot`` draws). ``validate``/``test`` always draw.
        source: ``"outputs"`` reads the step's LayerOutputs, ``"hooks"`` attaches forward hooks; ``"auto"`` uses hooks
            when paths are given or the module is not a layerwise module, else the outputs.
        blocks: dotted paths, relative to the LightningModule, of the block list, the final
            norm(s) and the classifier module(s) (applied in order); only for the hook source.
        final_norm: dotted paths, relative to the LightningModule, of the block list, the final
            norm(s) and the classifier module(s) (applied in order); only for the hook source.
        classifier: dotted paths, relative to the LightningModule, of the block list, the final
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
        # the options given other than their defaults: an analysis composed into LayerwiseAnalysis runs on the
        # composer's, which refuses them
        self.monitor_options = {name: value for name, value in locals().items() if _DEFAULTS.get(name, value) != value}
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        positive_int("token_stride", token_stride)
        if source not in ("auto", "outputs", "hooks"):
            raise ValueError(f"`source={source!r}` must be 'auto', 'outputs' or 'hooks'.")
        if pooling is not None and pooling not in ("cls", "mean", "last"):
            raise ValueError(f"`pooling={pooling!r}` must be 'cls', 'mean' or 'last'.")
        self.layers = layers
        self.save_features = save_features
        self.print_table = print_table
        self.source = source
        self.hook_paths = {"blocks": blocks, "final_norm": final_norm, "classifier": classifier, "pooling": pooling}
        self._source = FeatureSource(source, self.hook_paths)
        self.token_stride = token_stride
        self._spec: Optional[LayerSpec] = None
        self._states: dict[int, LoaderState] = {}  # per evaluation dataloader, kept while the layer spec holds
        self._state: Optional[LoaderState] = None  # the dataloader's being analysed
        self._selection = torch.tensor([], dtype=torch.long)
        self._position = (0, 0)  # (epoch, step) of the last report, for the console table's title

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
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

    # -- the analysis ---------------------------------------------------------------------------------------------

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._source.attach(pl_module)  # the hooks say the widths of a foreign model
        depth, dim, num_classes, token_level = self._source.dims(pl_module)
        numbers = [index + 1 for index in select_layers(self.layers, depth)]
        spec = LayerSpec(numbers, depth, dim, num_classes, token_level)
        if spec != self._spec:
            self.configure_analyses(trainer, spec)
            self._spec, self._states = spec, {}
            self._selection = torch.tensor([number - 1 for number in numbers])
        index = self.dataloader_idx or 0
        if index not in self._states:  # every dataloader its own metrics
            self._states[index] = LoaderState.build(self.analyses, spec)
        state = self._state = self._states[index]
        state.reset()
        for metric in state.metrics:
            metric.to(pl_module.device)
        self._selection = self._selection.to(pl_module.device)  # once, not a host-to-device copy at every batch
        state.start(self.loader, keep_indices=self.save_features and trainer.world_size > 1)

    def configure_analyses(self, trainer: Trainer, spec: LayerSpec) -> None:
        """Every analysis's metrics are for ``spec`` from now on: each reads what it needs of the run."""
        for analysis in self.analyses:
            analysis.spec = spec
            analysis.configure(trainer, self)

    def before_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any) -> None:
        self._source.before_batch(batch)

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        assert self._state is not None
        outputs = self._source.outputs(outputs, batch)
        self._state.collect(outputs, self._selection, self.token_stride, self.save_features)

    def stop(self) -> None:
        self._source.detach()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        for state in self._states.values():  # a failed evaluation holds no batch and no feature for the next one
            state.reset()

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """The analyses' results with the evaluation's header; the features saved (a collective when asked)."""
        state, spec = self._state, self._spec
        assert state is not None and spec is not None
        num_samples, results = state.reduce(spec, self.stage, type(self).__name__)  # one all-reduce of its states
        if self.save_features:
            state.saver.write(trainer, self.stage, run_log_dir(trainer))  # a gather: every rank
        header = {
            "split": evaluated_split(trainer.datamodule, self.stage),
            "num_samples": num_samples,
            "depth": spec.depth,
            "layers": spec.layer_numbers,
        }
        nonfinite = int(state.nonfinite.rows)
        state.reset()  # the states (e.g. the centred COS's buffered features) are not held until the next evaluation
        self._position = (trainer.current_epoch, trainer.global_step)
        return {**header, **results, "n_nonfinite": nonfinite}

    def summary_entries(self, results: dict[str, Any]) -> dict[str, Any]:
        return results  # the summary's top-level keys

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        return {key: value for analysis in self.analyses for key, value in analysis.layer_scalars(results).items()}

    def charts(self) -> dict[str, str]:
        return {title: regex for analysis in self.analyses for title, regex in analysis.layer_charts().items()}

    def figure_functions(self) -> list[tuple[FigureFunction, Optional[str]]]:
        """Every analysis's :attr:`figures`, each once: functions of the whole summary (its top-level keys)."""
        functions = [function for each in self.analyses for function, _ in AnalysisCallback.figure_functions(each)]
        return [(function, None) for function in dict.fromkeys(functions)]

    # -- what a per-layer analysis declares ---------------------------------------------------------------------

    spec: LayerSpec  # what the metrics are built for: set before configure

    @property
    def analyses(self) -> Sequence["LayerwiseMonitor"]:
        """The per-layer analyses this callback runs on its features: itself (``LayerwiseAnalysis``: several)."""
        return [self]

    @property
    def joins_batches(self) -> bool:
        """Whether :meth:`update` may get several batches joined into one.

        False for an estimator defined per dataloader minibatch: then every analysis of its dataloader is fed batch
        by batch.
        """
        return True

    def configure(self, trainer: Trainer, monitor: "LayerwiseMonitor") -> None:
        """Read what the analysis needs from the run before :meth:`build`; default: nothing.

        :attr:`spec` is set; ``monitor`` runs the analysis: itself, or the ``LayerwiseAnalysis`` it is one of.
        """

    def build(self, spec: LayerSpec) -> Metrics:
        """Fresh metrics for one evaluation dataloader, by name.

        The package's sum-state metrics are constructed with ``sync_on_compute=False``: they travel in the monitor's
        one all-reduce. A plain torchmetrics ``Metric`` (``sync_on_compute=True``, its default) syncs itself when
        :meth:`results` calls its ``compute``, on every rank.
        """
        return {}

    def update(self, metrics: Metrics, batch: LayerOutputs) -> None:
        """Feed consecutive evaluation batches, joined into one, to the metrics :meth:`build` made.

        Up to ``_loader.GROUP_BATCHES`` batches or ``_loader.GROUP_BYTES``, rows in order: a sum over rows is the
        same. An analysis whose result depends on where a dataloader batch ends says so by :attr:`joins_batches`.
        """

    def results(self, metrics: Metrics, earlier: dict[str, Any]) -> dict[str, Any]:
        """Results keyed as in the JSON summary (the states already reduced across ranks).

        ``earlier``: the results of the analyses run before it on the same features (the effective depth reads the
        logit lens's accuracy).
        """
        return {}

    def layer_scalars(self, results: dict[str, Any]) -> dict[str, float]:
        """Scalars to log from the results, keyed without the stage prefix, e.g. ``acc/layer_03``."""
        return {}

    def layer_charts(self) -> dict[str, str]:
        """TensorBoard multi-line charts: title -> regex of tag suffixes (all layers of one quantity)."""
        return {}

    def line(self, results: dict[str, Any]) -> str:
        if not self.print_table or self._spec is None:
            return ""
        epoch, step = self._position
        return layer_table(self.stage, epoch, step, results, self._spec)


_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(LayerwiseMonitor.__init__).parameters.items()
    if name != "self"
}
