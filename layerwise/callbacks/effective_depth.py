"""ε-effective depth: the first layer whose shared-head accuracy is good enough."""

from collections.abc import Sequence
from typing import Any, Optional

from torchmetrics import Metric

from layerwise.callbacks.family import shaped
from layerwise.callbacks.monitor import Family, LayerOutputs, LayerSpec, LayerwiseMonitor
from layerwise.metrics import LayerAccuracy, effective_depth

DEFAULT_EPSILONS = (0.01, 0.05, 0.1)


class EffectiveDepthFamily(Family):
    """Absolute (Acc^l >= 1 − ε) and relative (Acc^l >= Acc^L − ε) ε-effective depth."""

    def __init__(self, epsilons: Sequence[float] = DEFAULT_EPSILONS, accuracy_from: Optional[Family] = None) -> None:
        """``accuracy_from``: a family whose ``accuracy`` metric already accumulates the shared-head accuracy."""
        epsilons = [float(value) for value in epsilons]
        if not epsilons or any(not 0.0 < value <= 1.0 for value in epsilons):
            raise ValueError(
                f"`epsilons={epsilons}` must be a non-empty list of numbers in (0, 1] (ε = 0 asks for accuracy 1)."
            )
        self.epsilons = epsilons
        self.accuracy_from = accuracy_from

    def build(self, spec: LayerSpec) -> list[Metric]:
        if self.accuracy_from is not None:
            return []
        self.accuracy = LayerAccuracy(spec.num_layers, sync_on_compute=False)
        return [self.accuracy]

    def update(self, batch: LayerOutputs) -> None:
        if self.accuracy_from is None:
            self.accuracy.update(batch.readout, batch.targets)

    def compute(self) -> dict[str, Any]:
        spec = self.spec
        source = self if self.accuracy_from is None else self.accuracy_from
        accuracy = shaped(source.accuracy.compute()["accuracy"], spec.num_layers)
        numbers = spec.layer_numbers
        return {
            "effective_depth": effective_depth(accuracy, self.epsilons, numbers),
            "effective_depth_relative": effective_depth(accuracy, self.epsilons, numbers, relative=True),
        }

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        scalars = {f"effective_depth/eps_{eps}": float(v) for eps, v in results["effective_depth"].items()}
        relative = results["effective_depth_relative"].items()
        scalars.update({f"effective_depth_relative/eps_{eps}": float(v) for eps, v in relative})
        return scalars

    def charts(self) -> dict[str, str]:
        return {"effective depth": r"effective_depth/.*", "relative effective depth": r"effective_depth_relative/.*"}


class EffectiveDepthMonitor(LayerwiseMonitor):
    """ε-effective depth per ε: the first layer whose shared-head accuracy is good enough.

    The smallest layer with shared-head accuracy ``>= 1 − ε`` (else the last layer), and the variant relative to the
    last layer (``>= Acc^L − ε``), for every ε in ``epsilons`` (default ``DEFAULT_EPSILONS``: 0.01, 0.05, 0.1).

    Logged: ``val/effective_depth/eps_E`` and ``val/effective_depth_relative/eps_E``. JSON keys:
    ``effective_depth`` and ``effective_depth_relative`` (objects keyed by ε as a string, e.g. ``"0.05"``).
    """

    def __init__(self, epsilons: Sequence[float] = DEFAULT_EPSILONS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.families = [EffectiveDepthFamily(epsilons)]
