"""Neural collapse per layer: NC1 and CDNV, NC2, NC3 (against the shared head) and, opt-in, NC4."""

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from layerwise.analyses.base import Analysis, HeadReader, Metrics, RunModel, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.engines.readout import HeadInput, LayerOutputs, chunked_head_inputs, split_head
from layerwise.errors import LayerwiseWarning, UsageError
from layerwise.figures.summary import neural_collapse_figures
from layerwise.metrics import LayerNC1, LayerNeuralCollapse

# The JSON keys (each L) beside ``nc1``, and their chart titles; NC3 with a head split at a linear layer of K rows,
# NC4 with ``ncc=True``.
STREAMED = {
    "cdnv": "CDNV per layer",
    "nc2_equinorm": "NC2 equinorm (CV of class-mean norms) per layer",
    "nc2_cos_std": "NC2 std of class-mean cosines per layer",
    "nc2_equiangular": "NC2 mean |cos + 1/(K-1)| per layer",
    "nc2_etf": "NC2 simplex-ETF error per layer",
}
HEAD = {"nc3": "NC3 class means to head rows per layer", "nc3_duality": "NC3 self-duality error per layer"}
NCC = {"nc4_agreement": "NC4 NCC agreement with the head per layer", "nc4_ncc_accuracy": "NC4 NCC accuracy per layer"}


class NeuralCollapseMonitor(Analysis):
    """Neural collapse per layer, exact in one pass over the evaluated set (NC4: from a bounded buffer).

    NC1 is ``(1/K) tr(Σ_W Σ_B^†)``: ``Σ_W`` the within-class covariance, ``Σ_B`` the covariance of the class means
    around their mean; classes absent from the evaluated set are left out of ``K``; the pseudo-inverse is taken on
    the range of ``Σ_B`` (rank <= K-1). State: ``L·d²`` float64 plus class sums, independent of N.

    With ``complete=True`` (opt-in: the default summary keeps its keys), on the same features
    (:class:`~layerwise.metrics.LayerNeuralCollapse` has the formulas): the CDNV; NC2's equinorm, spread of the
    class-mean cosines, mean ``|cos + 1/(K-1)|`` and simplex-ETF error; NC3 between the centred class means of what
    the head's last linear layer reads at layer l (the head's own steps before it: the final norm, a pooler) and
    that layer's rows, when the head ends in a linear layer with one row per class. ``ncc=True`` adds NC4: the
    nearest-class-centre classifier with this evaluation's means, its agreement with the shared head's prediction
    at layer l and its accuracy; exact, from the features kept on each rank until the means are known (``L·N·d``
    in the features' dtype per rank, at most ``ncc_max_samples`` samples: beyond, NC4 is left out with a warning).

    For a language model the classes are the vocabulary; ``top_classes=k`` restricts NC1 to the samples whose
    target is one of the ``k`` most frequent tokens of the training split (from the datamodule's
    ``class_counts()``). Without it NC1 is left out of a language model's analysis (over a whole vocabulary it would
    need L x V x d statistics).

    Logged: ``val/nc1/layer_XX`` and, with ``complete``, ``val/<key>/layer_XX`` of every key below. JSON keys:
    ``nc1`` (L), ``nc1_classes`` (the class ids, when restricted); with ``complete`` ``cdnv``, ``nc2_equinorm``,
    ``nc2_cos_std``, ``nc2_equiangular``, ``nc2_etf``, ``nc3``, ``nc3_duality`` (L each; NC3 null without a linear
    last layer of K rows), with ``ncc`` ``nc4_agreement``, ``nc4_ncc_accuracy`` (L each).

    Args:
        top_classes: restrict to the samples of the k most frequent classes (language models).
        complete: every measure above, not NC1 alone (streamed: two more float64 states of L·K·d' and L·K).
        ncc: NC4 (buffers the features on each rank).
        ncc_max_samples: the per-rank limit of that buffer.
    """

    name = "neural_collapse"
    provides = ("nc1",)
    figures = staticmethod(neural_collapse_figures)  # draws nothing for NC1 alone

    def __init__(
        self,
        top_classes: Optional[int] = None,
        complete: bool = False,
        ncc: bool = False,
        ncc_max_samples: int = 65536,
        **refused: Any,
    ) -> None:
        refuse_runner_options(type(self).__name__, refused)
        if top_classes is not None and (isinstance(top_classes, bool) or not isinstance(top_classes, int)):
            raise UsageError(f"NeuralCollapseMonitor(top_classes={top_classes!r}): give an int >= 2 or None.")
        if top_classes is not None and top_classes < 2:
            raise ValueError(f"`top_classes={top_classes}` must be >= 2 (NC1 compares classes).")
        if ncc and not complete:
            raise UsageError("NeuralCollapseMonitor(ncc=True): NC4 reads the class means of `complete=True`; set both.")
        if isinstance(ncc_max_samples, bool) or not isinstance(ncc_max_samples, int) or ncc_max_samples < 1:
            raise UsageError(f"NeuralCollapseMonitor(ncc_max_samples={ncc_max_samples!r}): give a positive int.")
        self.top_classes = top_classes
        self.complete = complete
        self.ncc = ncc
        self.ncc_max_samples = ncc_max_samples
        self._class_ids: Optional[Tensor] = None
        self._active = True
        self._head_reader: Optional[HeadReader] = None
        self._head: Optional[HeadInput] = None

    @property
    def class_ids(self) -> Optional[Tensor]:
        """The classes NC1 is restricted to (``top_classes``), None for all."""
        return self._class_ids

    def use_model(self, model: RunModel) -> None:
        self._head_reader = model.head

    def configure(self, spec: LayerSpec, datamodule: Any) -> None:
        self._active = not spec.token_level or self.top_classes is not None
        self._class_ids = None
        if self._active and self.top_classes is not None:
            counts = getattr(datamodule, "class_counts", None)
            if counts is None:
                raise ValueError(
                    "`top_classes` needs the class frequencies: the datamodule must provide `class_counts()` "
                    "(layerwise.datamodules.TextDataModule does)."
                )
            frequencies = counts()
            self._class_ids = frequencies.argsort(descending=True, stable=True)[: self.top_classes].sort().values
            self._class_map = torch.full((spec.num_classes,), -1, dtype=torch.long)
            self._class_map[self._class_ids] = torch.arange(self._class_ids.numel())
        self._head = self._read_head(warn=True) if self._active and self.complete else None

    # -- the head's last linear layer (NC3): read afresh at every evaluation, the weights change while fitting -----

    def _read_head(self, warn: bool = False) -> Optional[HeadInput]:
        """The shared head split at its last linear layer, its rows those of the classes analysed; None: no NC3."""
        head = None if self._head_reader is None else self._head_reader()
        split = None if head is None else split_head(head)
        rows = self.spec.num_classes
        if split is None or split.weight.shape[0] != rows:
            if warn:
                rank_zero_warn(
                    f"NeuralCollapseMonitor: NC3 is left out (null): the shared head does not end in a linear layer "
                    f"with one row per class ({rows}).",
                    category=LayerwiseWarning,
                )
            return None
        if self.class_ids is not None:
            split = HeadInput(split.steps, split.weight[self.class_ids.to(split.weight.device)])
        return split

    def _fresh_head(self, metric: LayerNeuralCollapse) -> None:
        """At an evaluation's first update (or its results on a rank without samples): this evaluation's head."""
        if self._head is not None and metric.update_count == 0:
            self._head = self._read_head()

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        if not self._active:
            return {}
        num_classes = spec.num_classes if self.class_ids is None else self.class_ids.numel()
        layers, dim = spec.num_layers, spec.dim
        if not self.complete:
            return {
                "nc1": Statistic(
                    f"class_moments(top_classes={self.top_classes})",  # per-class sums and counts, within-class moments
                    lambda: LayerNC1(layers, dim, num_classes, sync_on_compute=False),
                    self.update,
                )
            }
        head_dim = None if self._head is None else self._head.weight.shape[1]
        return {
            "nc": Statistic(
                f"neural_collapse(top_classes={self.top_classes}, head_dim={head_dim}, ncc={self.ncc}, "
                f"ncc_max_samples={self.ncc_max_samples})",
                lambda: LayerNeuralCollapse(
                    layers,
                    dim,
                    num_classes,
                    head_dim=head_dim,
                    ncc=self.ncc,
                    max_buffered_samples=self.ncc_max_samples,
                    sync_on_compute=False,
                ),
                self.update,
            )
        }

    def update(self, metric: Any, batch: LayerOutputs) -> None:
        """Feed the class moments with every row, or those of the ``top_classes`` (renumbered)."""
        features, targets, predictions = batch.features, batch.targets, batch.readout.predictions
        assert targets is not None
        if self.class_ids is not None:
            self._class_map = self._class_map.to(targets.device)
            classes = self._class_map[targets]
            keep = torch.nonzero(classes >= 0).flatten()
            if not keep.numel():
                return
            features, targets = features[:, keep], classes[keep]
            predictions = self._class_map[predictions[:, keep]]  # a token outside the classes: -1, never the NCC's
        if not self.complete:
            metric.update(features, targets)
            return
        self._fresh_head(metric)
        head_inputs = None if self._head is None else chunked_head_inputs(self._head, features)
        metric.update(features, targets, predictions if self.ncc else None, head_inputs)

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        if not self._active:
            return {}
        layers = self.spec.num_layers
        if not self.complete:
            results: dict[str, Any] = {"nc1": shaped(metrics["nc1"].compute(), layers)}
        else:
            metric = metrics["nc"]
            self._fresh_head(metric)
            metric.classifier = None if self._head is None else self._head.weight
            results = {key: shaped(value, layers) for key, value in metric.compute().items()}
            if self._head is None:
                results.update({key: torch.full((layers,), float("nan")) for key in HEAD})
        if self.class_ids is not None:
            results["nc1_classes"] = self.class_ids.tolist()
        return results

    def _keys(self) -> dict[str, str]:
        """The per-layer keys this analysis reports, with their chart titles."""
        keys = {"nc1": "NC1 per layer"}
        if self.complete:
            keys.update({**STREAMED, **HEAD, **(NCC if self.ncc else {})})
        return keys

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        return {
            name: value
            for key in self._keys()
            if key in results
            for name, value in per_layer(results[key], self.spec, key).items()
        }

    def layer_charts(self) -> dict[str, str]:
        return {title: rf"{key}/layer_\d+" for key, title in self._keys().items()}
