"""Analysis callbacks: drop them into any Lightning Trainer."""

from layerwise.callbacks.analysis import LayerwiseAnalysis
from layerwise.callbacks.compare import CrossModelComparison
from layerwise.callbacks.coupling import BlockCoupling
from layerwise.callbacks.detection import DetectionLayerAP
from layerwise.callbacks.early_exit_writer import EarlyExitPredictionWriter
from layerwise.analyses.effective_depth import EffectiveDepthMonitor
from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.analyses.logit_lens import LogitLensMonitor
from layerwise.callbacks.monitor import LayerwiseMonitor
from layerwise.analyses.neural_collapse import NeuralCollapseMonitor
from layerwise.callbacks.progress import ProgressLines
from layerwise.callbacks.residual import ResidualNormRatioMonitor
from layerwise.analyses.similarity import LayerSimilarityMonitor
from layerwise.analyses.trajectory import TrajectoryMonitor

__all__ = [
    "AnalysisCallback",
    "BlockCoupling",
    "CrossModelComparison",
    "DetectionLayerAP",
    "EarlyExitPredictionWriter",
    "EffectiveDepthMonitor",
    "LayerSimilarityMonitor",
    "LayerwiseAnalysis",
    "LayerwiseMonitor",
    "LogitLensMonitor",
    "NeuralCollapseMonitor",
    "ProgressLines",
    "ResidualNormRatioMonitor",
    "TrajectoryMonitor",
]
