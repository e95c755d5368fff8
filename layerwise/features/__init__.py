"""Where layer outputs come from: one tap per model family, plus a generic hook tap."""

from layerwise.features.layers import select_layers
from layerwise.features.outputs import EXIT_LOGITS, FEATURES, LOGITS, TARGETS, check_layer_outputs, is_layer_outputs
from layerwise.features.pooling import POOLINGS, pool_tokens
from layerwise.features.timm_vit import TimmViT

__all__ = [
    "EXIT_LOGITS",
    "FEATURES",
    "LOGITS",
    "POOLINGS",
    "TARGETS",
    "TimmViT",
    "check_layer_outputs",
    "is_layer_outputs",
    "pool_tokens",
    "select_layers",
]
