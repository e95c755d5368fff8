"""Trajectory shape of the residual stream across the block outputs: line-shape score and expodistance."""

from typing import Any

from lightning.pytorch import Trainer

from layerwise.analyses.layer_spec import LayerSpec
from layerwise.callbacks.monitor import LayerOutputs, LayerwiseMonitor, Metrics
from layerwise.metrics import TrajectoryShape


class TrajectoryMonitor(LayerwiseMonitor):
    """LSS, expodistance and step norms of every sample's (or, for language models, every token's) trajectory.

    The trajectory is the sequence of the collected block outputs ``x^1 .. x^L`` (the analysis does not collect
    the embeddings ``x^0``; ``BlockCoupling`` measures from ``x^0``), so it has L - 1 steps; for vision models it is
    the pooled feature's (CLS token or mean) trajectory. Computed only when every layer is selected (a trajectory
    through a subset of the blocks would skip steps) and there are at least 3 layers. Uses the same rows as COS
    (``token_stride``).

    Logged: ``val/trajectory/lss``, ``val/trajectory/expodistance``. JSON keys: ``trajectory_lss``,
    ``trajectory_expodistance``, ``trajectory_step_variation`` (means over rows), ``trajectory_step_norm`` (per step
    l -> l+1) and ``trajectory_step_ratio``. Args: see :class:`LayerwiseMonitor`.
    """

    def configure(self, trainer: Trainer, monitor: LayerwiseMonitor) -> None:
        spec = self.spec
        self.active = spec.layer_numbers == list(range(1, spec.depth + 1)) and spec.num_layers >= 3

    def build(self, spec: LayerSpec) -> Metrics:
        return {"shape": TrajectoryShape(spec.num_layers - 1, sync_on_compute=False)} if self.active else {}

    def update(self, metrics: Metrics, batch: LayerOutputs) -> None:
        if self.active:
            metrics["shape"].update(batch.sampled_features)

    def results(self, metrics: Metrics, earlier: dict[str, Any]) -> dict[str, Any]:
        if not self.active:
            return {}
        return {f"trajectory_{key}": value for key, value in metrics["shape"].compute().items()}

    def layer_scalars(self, results: dict[str, Any]) -> dict[str, float]:
        if "trajectory_lss" not in results:
            return {}
        return {
            "trajectory/lss": float(results["trajectory_lss"]),
            "trajectory/expodistance": float(results["trajectory_expodistance"]),
        }
