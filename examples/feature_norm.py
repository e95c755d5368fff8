"""Add your own analysis: the mean feature norm of every layer, read from the pool of statistics (docs/callbacks.md)."""

import torch

from layerwise.analyses import Analysis, Statistic, per_layer
from layerwise.figures.style import layer_ticks, new_figure
from layerwise.metrics import LayerMean


def feature_norm_figures(summary):
    """Its figure: module-level, so the drawing process imports it by name (it gets the JSON summary)."""
    figure, axes = new_figure(4.5, 3.2)
    axes.plot(range(len(summary["layers"])), summary["feature_norm"], marker="o")
    layer_ticks(axes, summary["layers"], axis="x")
    axes.set(xlabel="layer", ylabel="mean ||h||")
    return {"feature_norm": figure}


def feed(metric, batch):
    """Feed the statistic a group of batches: LayerOutputs of the selected layers, real rows; features (L, N, d)."""
    metric.update(torch.linalg.vector_norm(batch.features.double(), dim=-1))


class FeatureNorm(Analysis):
    """JSON key ``feature_norm`` (one value per layer), scalars ``val/feature_norm/layer_XX``, a chart, a figure."""

    figures = staticmethod(feature_norm_figures)

    def statistics(self, spec):  # by name: an analysis declaring the same name reads the same metric, fed once
        return {"norm": Statistic("feature_norm", lambda: LayerMean(spec.num_layers, sync_on_compute=False), feed)}

    def results(self, metrics, earlier):  # every rank, after the one all-reduce of every statistic
        return {"feature_norm": metrics["norm"].compute()}

    def layer_scalars(self, results):
        return per_layer(results["feature_norm"], self.spec, "feature_norm")

    def layer_charts(self):
        return {"feature norm per layer": r"feature_norm/layer_\d+"}

    def line(self, results):  # on the JSON results
        norms = results["feature_norm"]
        return f"mean feature norm (layer 1 -> {len(norms)}): {norms[0]:.3f} -> {norms[-1]:.3f}"
