"""Where layer outputs come from: one tap per model family, plus a generic hook tap."""

from layerwise.features.backbone import IGNORE_INDEX, Backbone
from layerwise.features.hf_causal_lm import HFCausalLM
from layerwise.features.hf_encoder import HFEncoder
from layerwise.features.layers import select_layers
from layerwise.features.outputs import (
    EXIT_LOGITS,
    EXIT_PREFIX,
    FEATURES,
    LOGITS,
    MAX_PROB,
    NLL,
    POSITIONS,
    PREDICTIONS,
    SAMPLE_INDEX,
    TARGETS,
    check_layer_outputs,
    is_layer_outputs,
)
from layerwise.features.pooling import POOLINGS, pool_tokens
from layerwise.features.readout import chunked_cross_entropy, chunked_kl_divergence, chunked_readout
from layerwise.features.timm_vit import TimmViT

__all__ = [
    "EXIT_LOGITS",
    "EXIT_PREFIX",
    "FEATURES",
    "IGNORE_INDEX",
    "LOGITS",
    "MAX_PROB",
    "NLL",
    "POOLINGS",
    "POSITIONS",
    "PREDICTIONS",
    "SAMPLE_INDEX",
    "TARGETS",
    "Backbone",
    "HFCausalLM",
    "HFEncoder",
    "TimmViT",
    "chunked_cross_entropy",
    "chunked_kl_divergence",
    "chunked_readout",
    "check_layer_outputs",
    "is_layer_outputs",
    "pool_tokens",
    "select_layers",
]
