"""layerwise: trace and train layer-wise representation progression in transformers."""

__version__ = "0.2.0"
