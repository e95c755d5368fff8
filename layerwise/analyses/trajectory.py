"""Trajectory shape of the residual stream across the block outputs: line-shape score and expodistance."""

from collections.abc import Mapping
from typing import Any

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec
from layerwise.metrics import TrajectoryShape


class TrajectoryMonitor(Analysis):
    """LSS, expodistance and step norms of every sample's (or, for language models, every token's) trajectory.

    The trajectory is the sequence of the collected block outputs ``x^1 .. x^L`` (the analysis does not collect
    the embeddings ``x^0``; ``BlockCoupling`` measures from ``x^0``), so it has L - 1 steps; for vision models it is
    the pooled feature's (CLS token or mean) trajectory. Computed only when every layer is selected (a trajectory
    through a subset of the blocks would skip steps) and there are at least 3 layers. Uses the same rows as COS
    (``token_stride``).

    Logged: ``val/trajectory/lss``, ``val/trajectory/expodistance``. JSON keys: ``trajectory_lss``,
    ``trajectory_expodistance``, ``trajectory_step_variation`` (means over rows), ``trajectory_step_norm`` (per step
    l -> l+1) and ``trajectory_step_ratio``. No options.
    """

    name = "trajectory"
    provides = ("trajectory_lss", "trajectory_expodistance")

    def __init__(self, **refused: Any) -> None:
        refuse_runner_options(type(self).__name__, refused)
        self._active = True

    def configure(self, spec: LayerSpec, datamodule: Any) -> None:
        self._active = spec.layer_numbers == list(range(1, spec.depth + 1)) and spec.num_layers >= 3

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        if not self._active:
            return {}
        return {
            "shape": Statistic(
                "trajectory_shape",
                lambda: TrajectoryShape(spec.num_layers - 1, sync_on_compute=False),
                lambda metric, batch: metric.update(batch.sampled_features),
            )
        }

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        if not self._active:
            return {}
        return {f"trajectory_{key}": value for key, value in metrics["shape"].compute().items()}

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        if "trajectory_lss" not in results:
            return {}
        return {
            "trajectory/lss": float(results["trajectory_lss"]),
            "trajectory/expodistance": float(results["trajectory_expodistance"]),
        }
