"""Neural collapse per layer: NC1 and CDNV, NC2, NC3 (against the shared head) and, opt-in, NC4."""

from typing import Any, Optional

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from layerwise.callbacks._source import FeatureSource
from layerwise.callbacks.layer_spec import LayerSpec, per_layer, shaped
from layerwise.callbacks.monitor import LayerOutputs, LayerwiseMonitor, Metrics
from layerwise.engines.readout import HeadInput, chunked_head_inputs, split_head
from layerwise.errors import LayerwiseWarning
from layerwise.features.hooks import hook_paths
from layerwise.features.paths import HeadSteps
from layerwise.features.sharding import gathered_root
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


class NeuralCollapseMonitor(LayerwiseMonitor):
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
    ``class_counts()``). On its own the monitor requires it there; within ``LayerwiseAnalysis`` NC1 is left out of a
    language model's analysis without it (over a whole vocabulary it would need L x V x d statistics).

    Logged: ``val/nc1/layer_XX`` and, with ``complete``, ``val/<key>/layer_XX`` of every key below. JSON keys:
    ``nc1`` (L), ``nc1_classes`` (the class ids, when restricted); with ``complete`` ``cdnv``, ``nc2_equinorm``,
    ``nc2_cos_std``, ``nc2_equiangular``, ``nc2_etf``, ``nc3``, ``nc3_duality`` (L each; NC3 null without a linear
    last layer of K rows), with ``ncc`` ``nc4_agreement``, ``nc4_ncc_accuracy`` (L each).

    Args:
        top_classes: restrict to the samples of the k most frequent classes (language models).
        complete: every measure above, not NC1 alone (streamed: two more float64 states of L·K·d' and L·K).
        ncc: NC4 (buffers the features on each rank).
        ncc_max_samples: the per-rank limit of that buffer.
        kwargs: see :class:`LayerwiseMonitor`.
    """

    figures = staticmethod(neural_collapse_figures)  # draws nothing for NC1 alone

    def __init__(
        self,
        top_classes: Optional[int] = None,
        complete: bool = False,
        ncc: bool = False,
        ncc_max_samples: int = 65536,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if top_classes is not None and top_classes < 2:
            raise ValueError(f"`top_classes={top_classes}` must be >= 2 (NC1 compares classes).")
        if ncc and not complete:
            raise ValueError("NeuralCollapseMonitor: `ncc=True` needs `complete=True` (NC4 reads its class means).")
        if isinstance(ncc_max_samples, bool) or not isinstance(ncc_max_samples, int) or ncc_max_samples < 1:
            raise ValueError(f"NeuralCollapseMonitor: `ncc_max_samples={ncc_max_samples!r}` must be a positive int.")
        self.top_classes = top_classes
        self.complete = complete
        self.ncc = ncc
        self.ncc_max_samples = ncc_max_samples
        self.class_ids: Optional[Tensor] = None
        self.active = True
        self._module: Optional[nn.Module] = None
        self._hook_source: Optional[tuple[str, dict[str, Any]]] = None
        self._head: Optional[HeadInput] = None

    def configure(self, trainer: Trainer, monitor: LayerwiseMonitor) -> None:
        self.active = not self.spec.token_level or self.top_classes is not None
        if not self.active and monitor is self:
            raise ValueError(
                "NC1 over a whole vocabulary needs L x V x d statistics: set `top_classes` (e.g. 1000) to restrict it "
                "to the most frequent tokens."
            )
        self.class_ids = None
        if self.active and self.top_classes is not None:
            counts = getattr(getattr(trainer, "datamodule", None), "class_counts", None)
            if counts is None:
                raise ValueError(
                    "`top_classes` needs the class frequencies: the datamodule must provide `class_counts()` "
                    "(layerwise.datamodules.TextDataModule does)."
                )
            frequencies = counts()
            self.class_ids = frequencies.argsort(descending=True, stable=True)[: self.top_classes].sort().values
            self._class_map = torch.full((self.spec.num_classes,), -1, dtype=torch.long)
            self._class_map[self.class_ids] = torch.arange(self.class_ids.numel())
        if self.active and self.complete:
            self._module = trainer.lightning_module
            self._hook_source = (monitor.source, monitor.hook_paths)
            self._head = self._read_head(warn=True)

    # -- the head's last linear layer (NC3): read afresh at every evaluation, the weights change while fitting -----

    def _read_head(self, warn: bool = False) -> Optional[HeadInput]:
        """The shared head split at its last linear layer, its rows those of the classes analysed; None: no NC3."""
        module = self._module
        assert module is not None and self._hook_source is not None
        source, paths = self._hook_source
        backbone = getattr(module, "backbone", None)
        if FeatureSource(source, paths).uses_hooks(module):
            head: Optional[nn.Module] = HeadSteps(module, hook_paths(module, **paths).shared_head).copy()
        elif hasattr(backbone, "head_modules"):
            with gathered_root(backbone):  # FSDP2: the root unit's head gathered while it is copied
                head = backbone.head_modules()
        else:  # a module of the user's own returning LayerOutputs: its head is not known here
            head = None
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

    def build(self, spec: LayerSpec) -> Metrics:
        if not self.active:
            return {}
        num_classes = spec.num_classes if self.class_ids is None else self.class_ids.numel()
        if not self.complete:
            return {"nc1": LayerNC1(spec.num_layers, spec.dim, num_classes, sync_on_compute=False)}
        head_dim = None if self._head is None else self._head.weight.shape[1]
        metric = LayerNeuralCollapse(
            spec.num_layers,
            spec.dim,
            num_classes,
            head_dim=head_dim,
            ncc=self.ncc,
            max_buffered_samples=self.ncc_max_samples,
            sync_on_compute=False,
        )
        return {"nc": metric}

    def update(self, metrics: Metrics, batch: LayerOutputs) -> None:
        if not self.active:
            return
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
            metrics["nc1"].update(features, targets)
            return
        metric = metrics["nc"]
        self._fresh_head(metric)
        head_inputs = None if self._head is None else chunked_head_inputs(self._head, features)
        metric.update(features, targets, predictions if self.ncc else None, head_inputs)

    def results(self, metrics: Metrics, earlier: dict[str, Any]) -> dict[str, Any]:
        if not self.active:
            return {}
        layers = self.spec.num_layers
        if not self.complete:
            results = {"nc1": shaped(metrics["nc1"].compute(), layers)}
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
        """The per-layer keys this monitor reports, with their chart titles."""
        keys = {"nc1": "NC1 per layer"}
        if self.complete:
            keys.update({**STREAMED, **HEAD, **(NCC if self.ncc else {})})
        return keys

    def layer_scalars(self, results: dict[str, Any]) -> dict[str, float]:
        return {
            name: value
            for key in self._keys()
            if key in results
            for name, value in per_layer(results[key], self.spec, key).items()
        }

    def layer_charts(self) -> dict[str, str]:
        return {title: rf"{key}/layer_\d+" for key, title in self._keys().items()}
