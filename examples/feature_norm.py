"""Add your own analysis: the mean feature norm of every layer, on the callbacks' one lifecycle (docs/callbacks.md)."""

import torch
from torchmetrics import Metric

from layerwise.callbacks import AnalysisCallback
from layerwise.figures.style import layer_ticks, new_figure


class MeanFeatureNorm(Metric):
    """Mean L2 norm of every layer's features, (L, N, d) -> (L,): float64 sums, summed over processes."""

    def __init__(self, num_layers: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("norms", torch.zeros(num_layers, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, features: torch.Tensor) -> None:
        self.norms += torch.linalg.vector_norm(features.double(), dim=-1).sum(dim=1)
        self.count += features.shape[1]

    def compute(self) -> torch.Tensor:
        return self.norms / self.count


def feature_norm_figures(results):
    """The figure of the JSON results: module-level, so the drawing process imports it by name."""
    figure, axes = new_figure(4.5, 3.2)
    axes.plot(range(len(results["layers"])), results["mean"], marker="o")
    layer_ticks(axes, results["layers"], axis="x")
    axes.set(xlabel="layer", ylabel="mean ||h||")
    return {"feature_norm": figure}


class FeatureNormMonitor(AnalysisCallback):
    """JSON key ``feature_norm``, scalars ``val/feature_norm/layer_XX`` (one chart), a figure."""

    key = "feature_norm"

    def start(self, trainer, pl_module):  # an analysed validation epoch begins
        self.metric = MeanFeatureNorm(pl_module.num_layers).to(pl_module.device)

    def after_batch(self, trainer, pl_module, outputs, batch):
        features = outputs.features  # (L, B, d) of the LayerOutputs every layerwise module's validation_step returns
        rows = self.real_rows(features.shape[1])  # the DistributedSampler's padding is not counted
        if rows:
            self.metric.update(features[:, :rows])

    def compute(self, trainer, pl_module):  # on every rank: torchmetrics sums the states over processes here
        mean = self.metric.compute()
        return {"layers": list(range(1, len(mean) + 1)), "mean": mean}

    def scalars(self, results):
        return {f"feature_norm/layer_{n:02d}": float(v) for n, v in zip(results["layers"], results["mean"])}

    def charts(self):
        return {"feature norm per layer": r"feature_norm/layer_\d+"}

    def line(self, results):  # results as written to the JSON
        first, last = results["mean"][0], results["mean"][-1]
        return f"mean feature norm (layer 1 -> {len(results['mean'])}): {first:.3f} -> {last:.3f}"

    figures = staticmethod(feature_norm_figures)  # drawn in the drawing process, from the JSON results
