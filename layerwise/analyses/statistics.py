"""Statistics several package analyses read, declared once by name (the pool feeds each once)."""

from layerwise.analyses.base import Statistic
from layerwise.analyses.layer_spec import LayerSpec
from layerwise.metrics import LayerAccuracy


def layer_accuracy(spec: LayerSpec) -> Statistic:
    """The shared head's accuracy and loss per layer (``LayerAccuracy``): the logit lens and the effective depth."""
    return Statistic(
        "accuracy",
        lambda: LayerAccuracy(spec.num_layers, sync_on_compute=False),
        lambda metric, batch: metric.update(batch.readout, batch.targets),
    )
