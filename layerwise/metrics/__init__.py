"""Layer-wise metrics: pure functions in ``functional`` and torchmetrics ``Metric`` classes of sufficient statistics."""

from layerwise.metrics.compare import CrossModelCKA, MinibatchCrossCKA
from layerwise.metrics.count import LayerMean, NonFiniteRows, RowMean, SampleCount
from layerwise.metrics.dynamics import DepthCoupling, JacobianSpectrum, LinearisationCosine, TrajectoryShape
from layerwise.metrics.functional import Readout, layer_accuracy, readout_from_logits, saturation_layers
from layerwise.metrics.functional_collapse import (
    effective_depth,
    effective_depth_reached,
    nc1,
    neural_collapse_measures,
)
from layerwise.metrics.functional_compare import arccos_distance, cross_cka, minibatch_cross_cka
from layerwise.metrics.functional_dynamics import (
    coupling_score,
    depth_coupling,
    expodistance,
    line_shape_score,
    linearisation_cosine,
    mis_coupling,
    pairwise_mis_coupling,
    top_singular,
)
from layerwise.metrics.functional_family import debiased_cka, similarity_measures
from layerwise.metrics.functional_similarity import layer_cosine_similarity, linear_cka, saturation_cosine
from layerwise.metrics.neighbours import LayerRowSample
from layerwise.metrics.neural_collapse import LayerNC1, LayerNeuralCollapse
from layerwise.metrics.prediction import EarlyExit, LayerAccuracy, LayerF1, LensStatistics, SaturationHistogram
from layerwise.metrics.similarity import LayerCKA, LayerCosineSimilarity, MinibatchCKA, SaturationCosine
from layerwise.metrics.sync import all_reduce_sum_states

__all__ = [
    "CrossModelCKA",
    "MinibatchCrossCKA",
    "arccos_distance",
    "cross_cka",
    "debiased_cka",
    "similarity_measures",
    "minibatch_cross_cka",
    "DepthCoupling",
    "JacobianSpectrum",
    "LinearisationCosine",
    "TrajectoryShape",
    "coupling_score",
    "depth_coupling",
    "expodistance",
    "line_shape_score",
    "linearisation_cosine",
    "mis_coupling",
    "pairwise_mis_coupling",
    "top_singular",
    "EarlyExit",
    "LayerAccuracy",
    "LensStatistics",
    "LayerCKA",
    "LayerCosineSimilarity",
    "LayerF1",
    "LayerMean",
    "LayerNC1",
    "LayerRowSample",
    "LayerNeuralCollapse",
    "MinibatchCKA",
    "Readout",
    "SaturationCosine",
    "NonFiniteRows",
    "RowMean",
    "SampleCount",
    "SaturationHistogram",
    "all_reduce_sum_states",
    "effective_depth",
    "effective_depth_reached",
    "layer_accuracy",
    "layer_cosine_similarity",
    "linear_cka",
    "nc1",
    "neural_collapse_measures",
    "readout_from_logits",
    "saturation_cosine",
    "saturation_layers",
]
