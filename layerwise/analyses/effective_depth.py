"""ε-effective depth: the first layer whose shared-head accuracy is good enough."""

from collections.abc import Mapping, Sequence
from typing import Any

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, shaped
from layerwise.analyses.statistics import layer_accuracy
from layerwise.figures.summary import effective_depth_figures
from layerwise.metrics import effective_depth, effective_depth_reached

DEFAULT_EPSILONS = (0.01, 0.05, 0.1)


class EffectiveDepthMonitor(Analysis):
    """ε-effective depth per ε: the first layer whose shared-head accuracy is good enough.

    The smallest layer with shared-head accuracy ``>= 1 − ε`` (else the last layer), and the variant relative to the
    last layer (``>= Acc^L − ε``), for every ε in ``epsilons`` (default ``DEFAULT_EPSILONS``: 0.01, 0.05, 0.1).
    It reads the pool's statistic ``accuracy``, the one the logit lens reads: beside the lens it is accumulated once.

    Logged: ``val/effective_depth/eps_E`` (NaN, no point, where no layer reaches ``1 − ε``: never the last layer as
    if it did), ``val/effective_depth_reached/eps_E`` (1 or 0) and ``val/effective_depth_relative/eps_E``. JSON keys:
    ``effective_depth`` (the paper's convention: the last layer where none reaches it) with
    ``effective_depth_reached`` (false there) and ``effective_depth_relative`` (objects keyed by ε as a string, e.g.
    ``"0.05"``).
    """

    name = "depth"
    provides = ("effective_depth", "effective_depth_reached", "effective_depth_relative")
    figures = staticmethod(effective_depth_figures)

    def __init__(self, epsilons: Sequence[float] = DEFAULT_EPSILONS, **refused: Any) -> None:
        refuse_runner_options(type(self).__name__, refused)
        if not isinstance(epsilons, Sequence) or isinstance(epsilons, str):
            raise ValueError(f"EffectiveDepthMonitor(epsilons={epsilons!r}): give a list of numbers in (0, 1].")
        epsilons = [float(value) for value in epsilons]
        if not epsilons or any(not 0.0 < value <= 1.0 for value in epsilons):
            raise ValueError(
                f"`epsilons={epsilons}` must be a non-empty list of numbers in (0, 1] (ε = 0 asks for accuracy 1)."
            )
        self.epsilons = epsilons

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        return {"accuracy": layer_accuracy(spec)}

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        accuracy = shaped(metrics["accuracy"].compute()["accuracy"], self.spec.num_layers)
        numbers = self.spec.layer_numbers
        return {
            "effective_depth": effective_depth(accuracy, self.epsilons, numbers),
            "effective_depth_reached": effective_depth_reached(accuracy, self.epsilons),
            "effective_depth_relative": effective_depth(accuracy, self.epsilons, numbers, relative=True),
        }

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
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
