"""Within-class variability collapse (NC1) per layer."""

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import UsageError
from layerwise.metrics import LayerNC1


class NeuralCollapseMonitor(Analysis):
    """NC1 per layer, ``(1/K) tr(Σ_W Σ_B^†)``, exact in one pass over the evaluated set.

    ``Σ_W`` is the within-class covariance, ``Σ_B`` the covariance of the class means around their mean; classes
    absent from the evaluated set are left out of ``K``. The pseudo-inverse is taken on the range of ``Σ_B``
    (rank <= K-1). State: ``L·d²`` float64 plus class sums, independent of N.

    For a language model the classes are the vocabulary; ``top_classes=k`` restricts NC1 to the samples whose
    target is one of the ``k`` most frequent tokens of the training split (from the datamodule's
    ``class_counts()``). Without it NC1 is left out of a language model's analysis (over a whole vocabulary it would
    need L x V x d statistics).

    Logged: ``val/nc1/layer_XX``. JSON keys: ``nc1`` (L), ``nc1_classes`` (the class ids, when restricted).
    Args: ``top_classes``.
    """

    name = "neural_collapse"
    provides = ("nc1",)

    def __init__(self, top_classes: Optional[int] = None, **refused: Any) -> None:
        refuse_runner_options(type(self).__name__, refused)
        if top_classes is not None and (isinstance(top_classes, bool) or not isinstance(top_classes, int)):
            raise UsageError(f"NeuralCollapseMonitor(top_classes={top_classes!r}): give an int >= 2 or None.")
        if top_classes is not None and top_classes < 2:
            raise ValueError(f"`top_classes={top_classes}` must be >= 2 (NC1 compares classes).")
        self.top_classes = top_classes
        self._class_ids: Optional[Tensor] = None
        self._active = True

    @property
    def class_ids(self) -> Optional[Tensor]:
        """The classes NC1 is restricted to (``top_classes``), None for all."""
        return self._class_ids

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

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        if not self._active:
            return {}
        num_classes = spec.num_classes if self.class_ids is None else self.class_ids.numel()
        layers, dim = spec.num_layers, spec.dim
        return {
            "nc1": Statistic(
                f"class_moments(top_classes={self.top_classes})",  # per-class sums and counts, within-class moments
                lambda: LayerNC1(layers, dim, num_classes, sync_on_compute=False),
                self.update,
            )
        }

    def update(self, metric: Any, batch: LayerOutputs) -> None:
        """Feed the class moments with every row, or those of the ``top_classes`` (renumbered)."""
        if self.class_ids is None:
            metric.update(batch.features, batch.targets)
            return
        self._class_map = self._class_map.to(batch.targets.device)
        classes = self._class_map[batch.targets]
        keep = torch.nonzero(classes >= 0).flatten()
        if keep.numel():
            metric.update(batch.features[:, keep], classes[keep])

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        if not self._active:
            return {}
        results = {"nc1": shaped(metrics["nc1"].compute(), self.spec.num_layers)}
        if self.class_ids is not None:
            results["nc1_classes"] = self.class_ids.tolist()
        return results

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        return per_layer(results["nc1"], self.spec, "nc1") if "nc1" in results else {}

    def layer_charts(self) -> dict[str, str]:
        return {"NC1 per layer": r"nc1/layer_\d+"}
