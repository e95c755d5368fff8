"""LayerwiseMonitor: the per-layer metric families on the one lifecycle of the analysis callbacks.

When it runs and where its results go is :class:`~layerwise.callbacks.lifecycle.AnalysisCallback`'s; here: where
the features come from (``_source.py``), what one evaluation dataloader accumulates and how it reduces
(``_loader.py``), and the families' results as the summary's top-level keys.
"""

import copy
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import LightningModule, Trainer

from layerwise.callbacks._loader import LoaderState
from layerwise.callbacks._output import layer_table, run_log_dir
from layerwise.callbacks._source import FeatureSource
from layerwise.callbacks.family import Family, LayerSpec, per_layer
from layerwise.callbacks.lifecycle import AnalysisCallback, positive_int
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import UsageError
from layerwise.features.layers import LayerSelection, select_layers
from layerwise.results import evaluated_split

Source = Literal["auto", "outputs", "hooks"]
__all__ = ["Family", "LayerOutputs", "LayerSpec", "LayerwiseMonitor", "per_layer"]


class LayerwiseMonitor(AnalysisCallback):
    """Base of the per-layer analyses: metric families fed with the features of every layer of every batch.

    An :class:`~layerwise.callbacks.lifecycle.AnalysisCallback` (its docstring is the order of the hooks: every
    evaluation stage and dataloader, the all-reduce, the summary, the figures), whose results are the summary's
    top-level keys (``layers``, ``depth``, ``num_samples``, ``n_nonfinite``, and each family's, e.g. ``cos``,
    ``accuracy``), drawn by the package's own figures.

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
        self.families: list[Family] = []
        self._spec: Optional[LayerSpec] = None
        self._states: dict[int, LoaderState] = {}  # per evaluation dataloader, kept while the layer spec holds
        self._state: Optional[LoaderState] = None  # the dataloader's being analysed
        self._selection = torch.tensor([], dtype=torch.long)
        self._position = (0, 0)  # (epoch, step) of the last report, for the console table's title

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

    # -- the analysis ---------------------------------------------------------------------------------------------

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._source.attach(pl_module)  # the hooks say the widths of a foreign model
        depth, dim, num_classes, token_level = self._source.dims(pl_module)
        numbers = [index + 1 for index in select_layers(self.layers, depth)]
        spec = LayerSpec(numbers, depth, dim, num_classes, token_level)
        if spec != self._spec:
            for family in self.families:
                family.configure(trainer, spec)
            self._spec, self._states = spec, {}
            self._selection = torch.tensor([number - 1 for number in numbers])
        index = self.dataloader_idx or 0
        if index not in self._states:
            # the first dataloader feeds the callback's own families; every other one a copy (a deep copy of the list
            # keeps the links between families, e.g. effective depth reading the logit lens's accuracy)
            families = self.families if index == 0 else copy.deepcopy(self.families)
            self._states[index] = LoaderState.build(families, spec)
        state = self._state = self._states[index]
        state.reset()
        for metric in state.metrics:
            metric.to(pl_module.device)
        self._selection = self._selection.to(pl_module.device)  # once, not a host-to-device copy at every batch
        state.start(self.loader, keep_indices=self.save_features and trainer.world_size > 1)

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
        """The families' results with the evaluation's header; the features saved (a collective when asked)."""
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
        assert self._state is not None
        return {key: value for family in self._state.families for key, value in family.scalars(results).items()}

    def charts(self) -> dict[str, str]:
        return {title: regex for family in self.families for title, regex in family.charts().items()}

    def line(self, results: dict[str, Any]) -> str:
        if not self.print_table or self._spec is None:
            return ""
        epoch, step = self._position
        return layer_table(self.stage, epoch, step, results, self._spec)
