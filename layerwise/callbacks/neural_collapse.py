"""Within-class variability collapse (NC1) per layer."""

from typing import Any

from torchmetrics import Metric

from layerwise.callbacks.base import Family, LayerBatch, LayerSpec, LayerwiseMonitor, _per_layer
from layerwise.metrics import LayerNC1


class NeuralCollapseFamily(Family):
    """NC1 of every selected layer."""

    def build(self, spec: LayerSpec) -> list[Metric]:
        self.nc1 = LayerNC1(spec.num_layers, spec.dim, spec.num_classes, sync_on_compute=False)
        return [self.nc1]

    def update(self, batch: LayerBatch) -> None:
        self.nc1.update(batch.features, batch.targets)

    def compute(self, spec: LayerSpec) -> dict[str, Any]:
        return {"nc1": self.nc1.compute()}

    def scalars(self, results: dict[str, Any], spec: LayerSpec) -> dict[str, float]:
        return _per_layer(results["nc1"], spec, "nc1")

    def charts(self) -> dict[str, str]:
        return {"NC1 per layer": r"nc1/layer_\d+"}


class NeuralCollapseMonitor(LayerwiseMonitor):
    """NC1 per layer, ``(1/K) tr(Σ_W Σ_B^†)``, exact in one pass over the evaluated set.

    ``Σ_W`` is the within-class covariance, ``Σ_B`` the covariance of the class means around their mean; classes
    absent from the evaluated set are left out of ``K``. The pseudo-inverse is taken on the range of ``Σ_B``
    (rank <= K-1). State: ``L·d²`` float64 plus class sums, independent of N.

    Logged: ``val/nc1/layer_XX``. JSON key: ``nc1`` (L). Args: see :class:`LayerwiseMonitor`.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.families = [NeuralCollapseFamily()]
