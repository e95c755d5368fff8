"""Trajectory shape of the residual stream across the block outputs: line-shape score and expodistance."""

from typing import Any

from torchmetrics import Metric

from layerwise.callbacks.monitor import Family, LayerOutputs, LayerSpec
from layerwise.metrics import TrajectoryShape


class TrajectoryFamily(Family):
    """LSS, expodistance and step norms of every sample's (or, for language models, every token's) trajectory.

    The trajectory is the sequence of the collected block outputs ``x^1 .. x^L`` (the analysis does not collect
    the embeddings ``x^0``; ``BlockCoupling`` measures from ``x^0``), so it has L - 1 steps; for vision models it is
    the pooled feature's (CLS token or mean) trajectory. Computed only when every layer is selected (a trajectory
    through a subset of the blocks would skip steps) and there are at least 3 layers. Uses the same rows as COS
    (``token_stride``). JSON: ``trajectory_lss``, ``trajectory_expodistance``, ``trajectory_step_variation`` (means
    over rows), ``trajectory_step_norm`` (per step l -> l+1) and ``trajectory_step_ratio``.
    """

    def build(self, spec: LayerSpec) -> list[Metric]:
        self.active = spec.layer_numbers == list(range(1, spec.depth + 1)) and spec.num_layers >= 3
        if not self.active:
            return []
        self.shape = TrajectoryShape(spec.num_layers - 1, sync_on_compute=False)
        return [self.shape]

    def update(self, batch: LayerOutputs) -> None:
        if self.active:
            self.shape.update(batch.sampled_features)

    def compute(self) -> dict[str, Any]:
        if not self.active:
            return {}
        return {f"trajectory_{key}": value for key, value in self.shape.compute().items()}

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        if "trajectory_lss" not in results:
            return {}
        return {
            "trajectory/lss": float(results["trajectory_lss"]),
            "trajectory/expodistance": float(results["trajectory_expodistance"]),
        }
