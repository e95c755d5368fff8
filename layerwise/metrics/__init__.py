"""Layer-wise metrics: pure functions in ``functional`` and torchmetrics ``Metric`` classes of sufficient statistics."""

from layerwise.metrics.count import NonFiniteRows, SampleCount
from layerwise.metrics.functional import (
    Readout,
    effective_depth,
    layer_accuracy,
    layer_cosine_similarity,
    linear_cka,
    nc1,
    readout_from_logits,
    saturation_cosine,
    saturation_layers,
)
from layerwise.metrics.neural_collapse import LayerNC1
from layerwise.metrics.prediction import EarlyExit, LayerAccuracy, LayerF1, SaturationHistogram
from layerwise.metrics.similarity import LayerCKA, LayerCosineSimilarity, MinibatchCKA, SaturationCosine
from layerwise.metrics.sync import all_reduce_sum_states

__all__ = [
    "EarlyExit",
    "LayerAccuracy",
    "LayerCKA",
    "LayerCosineSimilarity",
    "LayerF1",
    "LayerNC1",
    "MinibatchCKA",
    "Readout",
    "SaturationCosine",
    "NonFiniteRows",
    "SampleCount",
    "SaturationHistogram",
    "all_reduce_sum_states",
    "effective_depth",
    "layer_accuracy",
    "layer_cosine_similarity",
    "linear_cka",
    "nc1",
    "readout_from_logits",
    "saturation_cosine",
    "saturation_layers",
]
