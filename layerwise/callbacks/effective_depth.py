"""ε-effective depth: the first layer whose shared-head accuracy is good enough."""

from collections.abc import Sequence
from typing import Any

from lightning.pytorch import Trainer

from layerwise.callbacks.layer_spec import LayerSpec, shaped
from layerwise.callbacks.logit_lens import LogitLensMonitor
from layerwise.callbacks.monitor import LayerOutputs, LayerwiseMonitor, Metrics
from layerwise.figures.summary import effective_depth_figures
from layerwise.metrics import LayerAccuracy, effective_depth, effective_depth_reached

DEFAULT_EPSILONS = (0.01, 0.05, 0.1)


class EffectiveDepthMonitor(LayerwiseMonitor):
    """ε-effective depth per ε: the first layer whose shared-head accuracy is good enough.

    The smallest layer with shared-head accuracy ``>= 1 − ε`` (else the last layer), and the variant relative to the
    last layer (``>= Acc^L − ε``), for every ε in ``epsilons`` (default ``DEFAULT_EPSILONS``: 0.01, 0.05, 0.1).
    Within ``LayerwiseAnalysis`` beside the logit lens it reads the lens's accuracy instead of accumulating it again.

    Logged: ``val/effective_depth/eps_E`` (NaN, no point, where no layer reaches ``1 − ε``: never the last layer as
    if it did), ``val/effective_depth_reached/eps_E`` (1 or 0) and ``val/effective_depth_relative/eps_E``. JSON keys:
    ``effective_depth`` (the paper's convention: the last layer where none reaches it) with
    ``effective_depth_reached`` (false there) and ``effective_depth_relative`` (objects keyed by ε as a string, e.g.
    ``"0.05"``).
    """

    figures = staticmethod(effective_depth_figures)

    def __init__(self, epsilons: Sequence[float] = DEFAULT_EPSILONS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        epsilons = [float(value) for value in epsilons]
        if not epsilons or any(not 0.0 < value <= 1.0 for value in epsilons):
            raise ValueError(
                f"`epsilons={epsilons}` must be a non-empty list of numbers in (0, 1] (ε = 0 asks for accuracy 1)."
            )
        self.epsilons = epsilons
        self.reads_lens = False

    def configure(self, trainer: Trainer, monitor: LayerwiseMonitor) -> None:
        before = list(monitor.analyses)[: list(monitor.analyses).index(self)]  # whose results it gets as `earlier`
        self.reads_lens = any(isinstance(analysis, LogitLensMonitor) for analysis in before)

    def build(self, spec: LayerSpec) -> Metrics:
        return {} if self.reads_lens else {"accuracy": LayerAccuracy(spec.num_layers, sync_on_compute=False)}

    def update(self, metrics: Metrics, batch: LayerOutputs) -> None:
        if "accuracy" in metrics:
            metrics["accuracy"].update(batch.readout, batch.targets)

    def results(self, metrics: Metrics, earlier: dict[str, Any]) -> dict[str, Any]:
        if self.reads_lens:
            accuracy = earlier["accuracy"]
        else:
            accuracy = shaped(metrics["accuracy"].compute()["accuracy"], self.spec.num_layers)
        numbers = self.spec.layer_numbers
        return {
            "effective_depth": effective_depth(accuracy, self.epsilons, numbers),
            "effective_depth_reached": effective_depth_reached(accuracy, self.epsilons),
            "effective_depth_relative": effective_depth(accuracy, self.epsilons, numbers, relative=True),
        }

    def layer_scalars(self, results: dict[str, Any]) -> dict[str, float]:
        reached = results.get("effective_depth_reached", {})
        scalars = {
            f"effective_depth/eps_{eps}": float(v) if reached.get(eps, True) else float("nan")
            for eps, v in results["effective_depth"].items()
        }
        scalars.update({f"effective_depth_reached/eps_{eps}": float(flag) for eps, flag in reached.items()})
        relative = results["effective_depth_relative"].items()
        scalars.update({f"effective_depth_relative/eps_{eps}": float(v) for eps, v in relative})
        return scalars

    def layer_charts(self) -> dict[str, str]:
        return {"effective depth": r"effective_depth/.*", "relative effective depth": r"effective_depth_relative/.*"}
