"""LayerwiseAnalysis: the one callback that runs the per-layer analyses over one pool of statistics."""

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar, Literal, Optional, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from layerwise.analyses import (
    Analysis,
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerSpec,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    TrajectoryMonitor,
)
from layerwise.analyses.base import RunModel, resolve_order
from layerwise.callbacks._loader import LoaderState
from layerwise.callbacks._output import layer_table, run_log_dir
from layerwise.callbacks._source import FeatureSource
from layerwise.callbacks.lifecycle import AnalysisCallback, positive_int
from layerwise.errors import UsageError
from layerwise.features.layers import LayerSelection, select_layers
from layerwise.figures.registry import FigureFunction
from layerwise.results import ANALYSES, evaluated_split

Source = Literal["auto", "outputs", "hooks"]


class LayerwiseAnalysis(AnalysisCallback):
    """Every layer-wise analysis at once: similarity, logit lens, neural collapse, effective depth, trajectory shape.

    The one callback that runs per-layer analyses (:class:`~layerwise.analyses.Analysis`: the package's and a
    user's in ``more``) on one feature source. Each analysis declares the statistics it reads by name; they are
    accumulated once per evaluation dataloader however many analyses read them (:class:`~layerwise.analyses.Pool`),
    reduced in one all-reduce, and every analysis's results are computed from them, an analysis that reads another's
    results after it. Each package analysis is ``True`` (its defaults), ``False`` (off) or the analysis with its own
    options, e.g. ``logit_lens=LogitLensMonitor(thresholds=[0.9])`` (in a config: ``logit_lens: {thresholds:
    [0.9]}``; on the command line ``--trainer.callbacks.logit_lens.thresholds=[0.9]``).

    Features come from the module's ``validation_step`` output when it is a
    :class:`~layerwise.engines.readout.LayerOutputs` (every :class:`~layerwise.lightning_modules.LayerwiseModule`
    returns one), or from forward hooks on the blocks of any other model (``source="hooks"``; paths from the built-in
    table for timm ViTs and Hugging Face BERT/GPT-2/LLaMA, or from ``blocks``/``final_norm``/``classifier``). Hooks
    live only while a dataloader is analysed and are always removed, also when the run fails.

    Exactness under DDP: every rank feeds only its own real samples (the padding that ``DistributedSampler`` adds
    to even out an uneven validation set is dropped), all statistics are summed with one all-reduce, and every
    rank computes the same result. Figures and the JSON summary are written on global rank zero.

    Several evaluation dataloaders (e.g. a distribution-shifted validation set next to the clean one) are analysed
    separately, each with its own pool: the first is reported as ``val`` (``test``), every other one as
    ``val_<name>`` — its key when ``val_dataloader`` returns a dict, else its index — in its own JSON summary
    (``val_<name>_epoch_...json``), scalars (``val_<name>/acc/layer_XX``) and figures.

    Writes ``<log_dir>/layerwise/val_epoch_<EEE>_step_<SSSSSSS>.json`` (one per analysed validation) with the keys of
    the JSON summary page (docs/json-format.md), among them ``analyses`` (every analysis's class and options), and
    logs the scalars listed in the callbacks' reference.

    Args:
        similarity: COS and CKA between every pair of layers (:class:`LayerSimilarityMonitor`: ``center``, ``cka``,
            ``max_buffered_samples``, ``cos_bins``).
        logit_lens: the shared head at every layer: accuracy, loss, saturation, early exit (:class:`LogitLensMonitor`:
            ``thresholds``, ``center``, ``max_buffered_samples``, ``f1``).
        neural_collapse: NC1 per layer (:class:`NeuralCollapseMonitor`: ``top_classes``; ``complete`` for CDNV, NC2
            and NC3, ``ncc`` for NC4). For a language model NC1 runs only when ``top_classes`` is set: over a whole
            vocabulary it is off by default.
        depth: the ε-effective depth (:class:`EffectiveDepthMonitor`: ``epsilons``).
        trajectory: the line-shape score and expodistance of the block outputs (:class:`TrajectoryMonitor`).
        more: further analyses of your own (:class:`~layerwise.analyses.Analysis` subclasses), one or a list, run on
            the same features and pool.
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate``/``test`` always analyse).
        layers: which layers: None = all, int n = the last n, list = 0-based block indices (negatives allowed).
        save_features: also write ``<log_dir>/layerwise/<stage>_epoch_<EEE>_step_<SSSSSSS>_features.pt`` with
            ``features`` (L x N x d float32), ``labels`` (N), ``predictions`` (L x N) and ``max_prob`` (L x N).
            Holds the evaluated features in CPU memory for the epoch.
        print_table: print a per-layer table (accuracy, COS/CKA to the last layer, NC1) and the summary's path at
            the end of every analysed validation (global rank zero only); the analyses' own lines are printed too.
        log_figures: draw heatmaps/histograms as images in every logger (PNG files without one; global rank zero only).
        figures_every_n_epochs: while fitting, draw them only every n-th analysed epoch and at the last epoch
            (default every epoch: the figures are drawn off the training loop, ``callbacks/_drawing.py``; the JSON of
            every epoch holds everything ``layerwise plot`` draws). ``validate``/``test`` always draw.
        source: ``"outputs"`` reads the step's LayerOutputs, ``"hooks"`` attaches forward hooks; ``"auto"`` uses hooks
            when paths are given or the module is not a layerwise module, else the outputs.
        blocks: dotted path, relative to the LightningModule, of the block list (hook source only).
        final_norm: dotted path(s) of the final norm(s) (hook source only).
        classifier: dotted path(s) of the classifier module(s), applied in order (hook source only).
        pooling: ``"cls"``, ``"mean"`` or ``"last"`` token of each block output (hook source; default from the table).
        token_stride: language models: COS, CKA and the saturation COS use only positions ``t`` with
            ``t % token_stride == 0`` (a subsample that does not depend on batching or the number of processes);
            accuracy, loss, saturation counts and early exit always use every token.
    """

    # Options LayerwiseAnalysis took until 0.2.0, and where each went: the errors of Python and the command line name it
    moved_options: ClassVar[dict[str, str]] = {
        "thresholds": "logit_lens: {thresholds: [...]}",
        "f1": "logit_lens: {f1: ...}",
        "cka": "similarity: {cka: ...}",
        "cos_bins": "similarity: {cos_bins: ...}",
        "center": "similarity: {center: ...} and logit_lens: {center: ...}",
        "max_buffered_samples": "similarity: {max_buffered_samples: ...} and logit_lens: {max_buffered_samples: ...}",
        "epsilons": "depth: {epsilons: [...]}",
        "nc1_top_classes": "neural_collapse: {top_classes: ...}",
    }

    def __init__(
        self,
        similarity: Union[bool, LayerSimilarityMonitor] = True,
        logit_lens: Union[bool, LogitLensMonitor] = True,
        neural_collapse: Union[bool, NeuralCollapseMonitor] = True,
        depth: Union[bool, EffectiveDepthMonitor] = True,
        trajectory: Union[bool, TrajectoryMonitor] = True,
        more: Union[Analysis, Sequence[Analysis]] = (),
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
        max_state_bytes: Optional[int] = None,
        **moved: Any,
    ) -> None:
        for option, value in moved.items():
            where = self.moved_options.get(option)
            if where is None:
                raise TypeError(f"LayerwiseAnalysis has no option `{option}`: see help(LayerwiseAnalysis).")
            raise UsageError(f"LayerwiseAnalysis({option}={value!r}): the option moved to {where}.")
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        positive_int("token_stride", token_stride)
        if max_state_bytes is not None:
            positive_int("max_state_bytes", max_state_bytes)
        self.max_state_bytes = max_state_bytes
        _check_layers(layers)
        if source not in ("auto", "outputs", "hooks"):
            raise UsageError(f"LayerwiseAnalysis(source={source!r}): give 'auto', 'outputs' or 'hooks'.")
        if pooling is not None and pooling not in ("cls", "mean", "last"):
            raise UsageError(f"LayerwiseAnalysis(pooling={pooling!r}): give 'cls', 'mean', 'last' or None.")
        self.layers = layers
        self.save_features = save_features
        self.print_table = print_table
        self.source = source
        self.hook_paths = {"blocks": blocks, "final_norm": final_norm, "classifier": classifier, "pooling": pooling}
        self._source = FeatureSource(source, self.hook_paths)
        self.token_stride = token_stride
        given = _chosen(
            {
                "similarity": (similarity, LayerSimilarityMonitor),
                "logit_lens": (logit_lens, LogitLensMonitor),
                "neural_collapse": (neural_collapse, NeuralCollapseMonitor),
                "depth": (depth, EffectiveDepthMonitor),
                "trajectory": (trajectory, TrajectoryMonitor),
            }
        )
        given += _more(more)
        if not given:
            raise UsageError("LayerwiseAnalysis with every analysis switched off analyses nothing.")
        names = [analysis.name for analysis in given]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise UsageError(f"LayerwiseAnalysis(more=...): two analyses are named {twice[0]!r}: give one a `name`.")
        self._analyses = given  # as given: the summary's record
        self._ordered = resolve_order(given)  # as computed: those read by others first
        self._spec: Optional[LayerSpec] = None
        self._states: dict[int, LoaderState] = {}  # per evaluation dataloader, kept while the layer spec holds
        self._state: Optional[LoaderState] = None  # the dataloader's being analysed
        self._keys: dict[str, list[str]] = {}  # each analysis's result keys, by its name
        self._selection = torch.tensor([], dtype=torch.long)
        self._position = (0, 0)  # (epoch, step) of the last report, for the console table's title

    @property
    def analyses(self) -> Sequence[Analysis]:
        """The analyses it runs, as given (the package's, then ``more``)."""
        return self._analyses

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        for other in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(other, LayerwiseAnalysis) and other is not self and other.layers != self.layers:
                raise UsageError(
                    f"LayerwiseAnalysis(layers={self.layers!r}) and LayerwiseAnalysis(layers={other.layers!r}) would "
                    "write one summary with different layers: give both the same `layers`, or use one."
                )
        depth = self._source.depth(pl_module)  # before any work: a bad selection must not cost a training run
        try:
            select_layers(self.layers, depth)
        except ValueError as error:
            raise UsageError(f"LayerwiseAnalysis: {error}") from None

    # -- the lifecycle's steps ------------------------------------------------------------------------------------

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._source.attach(pl_module)  # the hooks say the widths of a foreign model
        depth, dim, num_classes, token_level = self._source.dims(pl_module)
        numbers = [index + 1 for index in select_layers(self.layers, depth)]
        spec = LayerSpec(numbers, depth, dim, num_classes, token_level)
        for analysis in self._analyses:  # the head as it is at each evaluation (NC3 reads it)
            analysis.use_model(RunModel(pl_module, self._source.tap, partial(self._source.shared_head, pl_module)))
        if spec != self._spec:
            self.configure_analyses(getattr(trainer, "datamodule", None), spec)
            self._spec, self._states = spec, {}
            self._selection = torch.tensor([number - 1 for number in numbers])
        index = self.dataloader_idx or 0
        if index not in self._states:  # every dataloader its own pool
            self._states[index] = LoaderState.build(self._ordered, spec)
            if not index:
                self._check_state_bytes(self._states[index], pl_module.device)
        state = self._state = self._states[index]
        state.reset()
        for metric in state.metrics:
            metric.to(pl_module.device)
        self._selection = self._selection.to(pl_module.device)  # once, not a host-to-device copy at every batch
        state.start(self.loader, keep_indices=self.save_features and trainer.world_size > 1)

    def _check_state_bytes(self, state: LoaderState, device: torch.device) -> None:
        """Say in one line (rank zero) what the statistics hold; refuse when it exceeds the budget.

        The budget: ``max_state_bytes``, else on a GPU its total memory (statistics larger than the device cannot be
        held), else none.
        """
        sizes = state.pool.state_bytes()
        total = sum(sizes.values())
        budget = self.max_state_bytes
        if budget is None and device.type == "cuda":
            budget = torch.cuda.get_device_properties(device).total_memory
        largest = ", ".join(f"{name} {_gb(size)}" for name, size in sorted(sizes.items(), key=lambda x: -x[1])[:3])
        rank_zero_info(
            f"LayerwiseAnalysis: the statistics hold {_gb(total)} per evaluation dataloader on each process "
            f"(largest: {largest}); budget {'none' if budget is None else _gb(budget)} (`max_state_bytes`)."
        )
        if budget is not None and total > budget:
            raise UsageError(
                f"LayerwiseAnalysis: the statistics need {_gb(total)} per evaluation dataloader (largest: {largest}), "
                f"more than {'max_state_bytes=' + str(budget) if self.max_state_bytes else 'the device'} "
                f"({_gb(budget)}): select fewer `layers`, use similarity's pairs='to_last' (exact, O(L·d²)) or "
                "cka='minibatch', or raise `max_state_bytes`."
            )

    def configure_analyses(self, datamodule: Any, spec: LayerSpec) -> None:
        """Every analysis's statistics are for ``spec`` from now on: each reads what it needs of the run."""
        for analysis in self._analyses:
            analysis.spec = spec
            analysis.configure(spec, datamodule)

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
        num_samples, each = state.reduce(spec, self.stage, "LayerwiseAnalysis")  # one all-reduce of the pool
        if self.save_features:
            state.saver.write(trainer, self.stage, run_log_dir(trainer))  # a gather: every rank
        header = {
            "split": evaluated_split(getattr(trainer, "datamodule", None), self.stage),
            "num_samples": num_samples,
            "depth": spec.depth,
            "layers": spec.layer_numbers,
        }
        own = dict(zip((analysis.name for analysis in self._ordered), each))
        self._keys = {name: list(results) for name, results in own.items()}
        results = {key: value for analysis in self._analyses for key, value in own[analysis.name].items()}
        nonfinite = int(state.nonfinite.rows)
        state.reset()  # the states (e.g. the centred COS's buffered features) are not held until the next evaluation
        self._position = (trainer.current_epoch, trainer.global_step)
        return {**header, **results, "n_nonfinite": nonfinite}

    def summary_entries(self, results: dict[str, Any]) -> dict[str, Any]:
        """The results as the summary's top-level keys, and ``analyses``: each one's class, options and columns."""
        record = {}
        for analysis in self._analyses:
            own = {key: results[key] for key in self._keys.get(analysis.name, ()) if key in results}
            kind = type(analysis)
            record[analysis.name] = {
                "class": f"{kind.__module__}.{kind.__qualname__}",
                "options": analysis.options(),
                "columns": analysis.columns(own),
            }
        return {**results, ANALYSES: record}

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        return {key: value for analysis in self._analyses for key, value in analysis.layer_scalars(results).items()}

    def charts(self) -> dict[str, str]:
        return {title: regex for analysis in self._analyses for title, regex in analysis.layer_charts().items()}

    def figure_functions(self) -> list[tuple[FigureFunction, Optional[str]]]:
        """Every analysis's :attr:`~layerwise.analyses.Analysis.figures`, each once: functions of the whole summary."""
        functions = [type(analysis).figures for analysis in self._analyses]
        return [(function, None) for function in dict.fromkeys(functions) if function is not None]

    def line(self, results: dict[str, Any]) -> str:
        """The per-layer table (``print_table``) and every analysis's own line."""
        lines = []
        if self.print_table and self._spec is not None:
            epoch, step = self._position
            lines.append(layer_table(self.stage, epoch, step, results, self._spec))
        own = (
            analysis.line({key: results[key] for key in self._keys.get(analysis.name, ())})
            for analysis in self._analyses
        )
        lines += [text for text in own if text]
        return "\n".join(lines)


def _check_layers(layers: Any) -> None:
    """Refuse at construction a ``layers`` that is not None, an int >= 1 or a list of ints (one line)."""
    if layers is None or (isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1):
        return
    if isinstance(layers, Sequence) and not isinstance(layers, str) and layers:
        if all(isinstance(index, int) and not isinstance(index, bool) for index in layers):
            return
    raise UsageError(
        f"LayerwiseAnalysis(layers={layers!r}): give None (every layer), an int n >= 1 (the last n layers) or a "
        "list of 0-based block indices (negatives count from the end, -1 is the last)."
    )


def _chosen(options: Mapping[str, tuple[Any, type[Analysis]]]) -> list[Analysis]:
    """The package's analyses switched on: ``True`` (its defaults) or the analysis itself."""
    analyses = []
    for name, (value, kind) in options.items():
        if value is True:
            analyses.append(kind())
        elif isinstance(value, kind):
            analyses.append(value)
        elif value is not False:
            raise UsageError(f"LayerwiseAnalysis({name}={value!r}): give True, False or a {kind.__name__}(...).")
    return analyses


def _more(more: Any) -> list[Analysis]:
    """``more``: one analysis or a sequence of them (a user's ``Analysis`` subclasses)."""
    given = [more] if isinstance(more, Analysis) else more
    if not isinstance(given, Sequence) or isinstance(given, str):
        raise UsageError(
            f"LayerwiseAnalysis(more={more!r}): give an analysis or a list of them (layerwise.analyses.Analysis)."
        )
    for analysis in given:
        if not isinstance(analysis, Analysis):
            raise UsageError(
                f"LayerwiseAnalysis(more=[..., {analysis!r}]): `more` takes analyses (subclasses of "
                "layerwise.analyses.Analysis), not callbacks or other objects."
            )
    return list(given)


def _gb(size: int) -> str:
    """Bytes in kB, MB or GB, as the line prints them."""
    if size < 1e6:
        return f"{size / 1e3:.1f} kB"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"
