"""Analysis callbacks: drop them into any Lightning Trainer.

The per-layer analyses (``LayerSimilarityMonitor``, ``LogitLensMonitor``, ...) are plain objects of
:mod:`layerwise.analyses`, run by :class:`LayerwiseAnalysis`; they are importable from here too.
"""

from typing import Any

from layerwise.analyses import (
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    TrajectoryMonitor,
)
from layerwise.callbacks.analysis import LayerwiseAnalysis
from layerwise.callbacks.compare import CrossModelComparison
from layerwise.callbacks.coupling import BlockCoupling
from layerwise.callbacks.detection import DetectionLayerAP
from layerwise.callbacks.early_exit_writer import EarlyExitPredictionWriter
from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.callbacks.progress import ProgressLines
from layerwise.callbacks.residual import ResidualNormRatioMonitor

__all__ = [
    "AnalysisCallback",
    "BlockCoupling",
    "CrossModelComparison",
    "DetectionLayerAP",
    "EarlyExitPredictionWriter",
    "EffectiveDepthMonitor",
    "LayerSimilarityMonitor",
    "LayerwiseAnalysis",
    "LogitLensMonitor",
    "NeuralCollapseMonitor",
    "ProgressLines",
    "ResidualNormRatioMonitor",
    "TrajectoryMonitor",
]


def __getattr__(name: str) -> Any:
    if name == "LayerwiseMonitor":  # the per-layer base until 0.2.0: one line saying what took its place
        raise ImportError(
            "layerwise.callbacks.LayerwiseMonitor is gone: a per-layer analysis subclasses layerwise.analyses.Analysis "
            "and runs in LayerwiseAnalysis(more=[...]); its options (layers, every_n_epochs, ...) go to "
            "LayerwiseAnalysis."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
