"""Within-class variability collapse (NC1) per layer."""

from typing import Any, Optional

import torch
from lightning.pytorch import Trainer
from torch import Tensor

from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.callbacks.monitor import LayerOutputs, LayerwiseMonitor, Metrics
from layerwise.metrics import LayerNC1


class NeuralCollapseMonitor(LayerwiseMonitor):
    """NC1 per layer, ``(1/K) tr(Σ_W Σ_B^†)``, exact in one pass over the evaluated set.

    ``Σ_W`` is the within-class covariance, ``Σ_B`` the covariance of the class means around their mean; classes
    absent from the evaluated set are left out of ``K``. The pseudo-inverse is taken on the range of ``Σ_B``
    (rank <= K-1). State: ``L·d²`` float64 plus class sums, independent of N.

    For a language model the classes are the vocabulary; ``top_classes=k`` restricts NC1 to the samples whose
    target is one of the ``k`` most frequent tokens of the training split (from the datamodule's
    ``class_counts()``). On its own the monitor requires it there; within ``LayerwiseAnalysis`` NC1 is left out of a
    language model's analysis without it (over a whole vocabulary it would need L x V x d statistics).

    Logged: ``val/nc1/layer_XX``. JSON keys: ``nc1`` (L), ``nc1_classes`` (the class ids, when restricted).
    Args: ``top_classes``, and see :class:`LayerwiseMonitor`.
    """

    def __init__(self, top_classes: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if top_classes is not None and top_classes < 2:
            raise ValueError(f"`top_classes={top_classes}` must be >= 2 (NC1 compares classes).")
        self.top_classes = top_classes
        self.class_ids: Optional[Tensor] = None
        self.active = True

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

    def build(self, spec: LayerSpec) -> Metrics:
        if not self.active:
            return {}
        num_classes = spec.num_classes if self.class_ids is None else self.class_ids.numel()
        return {"nc1": LayerNC1(spec.num_layers, spec.dim, num_classes, sync_on_compute=False)}

    def update(self, metrics: Metrics, batch: LayerOutputs) -> None:
        if not self.active:
            return
        if self.class_ids is None:
            metrics["nc1"].update(batch.features, batch.targets)
            return
        self._class_map = self._class_map.to(batch.targets.device)
        classes = self._class_map[batch.targets]
        keep = torch.nonzero(classes >= 0).flatten()
        if keep.numel():
            metrics["nc1"].update(batch.features[:, keep], classes[keep])

    def results(self, metrics: Metrics, earlier: dict[str, Any]) -> dict[str, Any]:
        if not self.active:
            return {}
        results = {"nc1": shaped(metrics["nc1"].compute(), self.spec.num_layers)}
        if self.class_ids is not None:
            results["nc1_classes"] = self.class_ids.tolist()
        return results

    def layer_scalars(self, results: dict[str, Any]) -> dict[str, float]:
        return per_layer(results["nc1"], self.spec, "nc1") if "nc1" in results else {}

    def layer_charts(self) -> dict[str, str]:
        return {"NC1 per layer": r"nc1/layer_\d+"}
