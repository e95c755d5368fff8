"""Training strategies: one shared-head base; each strategy overrides only its loss."""

from layerwise.lightning_modules.aligned import Aligned
from layerwise.lightning_modules.alternating import AlternatingAligned
from layerwise.lightning_modules.base import LayerwiseModule
from layerwise.lightning_modules.cos_regularized import CosRegularized
from layerwise.lightning_modules.detection import DetrLayerwise
from layerwise.lightning_modules.multi_exit import MultiExit
from layerwise.lightning_modules.probes import LinearProbes
from layerwise.lightning_modules.schedules import WarmupCosineLR
from layerwise.lightning_modules.standard import Standard
from layerwise.lightning_modules.stitched import Stitched, StitchingLayer
from layerwise.lightning_modules.tuned_lens import TunedLens
from layerwise.lightning_modules.weights import resolve_layer_weights

__all__ = [
    "Aligned",
    "AlternatingAligned",
    "CosRegularized",
    "DetrLayerwise",
    "LayerwiseModule",
    "LinearProbes",
    "MultiExit",
    "Standard",
    "Stitched",
    "StitchingLayer",
    "TunedLens",
    "WarmupCosineLR",
    "resolve_layer_weights",
]
