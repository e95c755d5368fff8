"""Per-layer analyses as plain objects over one pool of statistics (run by ``callbacks.LayerwiseAnalysis``).

An analysis (:class:`Analysis`) declares its options, the statistics it reads by name (:class:`Statistic`), its
results, scalars, charts, console line and figure; the :class:`Pool` accumulates each statistic once per evaluation
dataloader, however many analyses read it, and the callback reduces them in one all-reduce.
"""

from layerwise.analyses.base import Analysis, Metrics, RunModel, Statistic
from layerwise.analyses.effective_depth import EffectiveDepthMonitor
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.analyses.logit_lens import LogitLensMonitor
from layerwise.analyses.neural_collapse import NeuralCollapseMonitor
from layerwise.analyses.pool import Pool
from layerwise.analyses.similarity import LayerSimilarityMonitor
from layerwise.analyses.trajectory import TrajectoryMonitor

__all__ = [
    "Analysis",
    "EffectiveDepthMonitor",
    "LayerSimilarityMonitor",
    "LayerSpec",
    "LogitLensMonitor",
    "Metrics",
    "NeuralCollapseMonitor",
    "Pool",
    "RunModel",
    "Statistic",
    "TrajectoryMonitor",
    "per_layer",
    "shaped",
]
