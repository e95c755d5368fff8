"""Layer access: where the layers of a model live (one table), hooks on them, truncation, and the backbones."""

from layerwise.features.backbone import IGNORE_INDEX, Backbone
from layerwise.features.hf_causal_lm import HFCausalLM
from layerwise.features.hf_encoder import HFEncoder
from layerwise.features.hooks import HookTap, collect_block_outputs, hooked_blocks
from layerwise.features.jacobian import BlockTrace, block_jacobian, diagonal_jacobians, trace_blocks
from layerwise.features.layers import select_layers
from layerwise.features.mlp import MLPBackbone
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
from layerwise.features.paths import FAMILIES, LayerPaths, find_layer_paths, get_blocks, layer_paths
from layerwise.features.pooling import POOLINGS, pool_tokens
from layerwise.features.timm_vit import TimmViT
from layerwise.features.truncate import truncated, truncated_copy

__all__ = [
    "MLPBackbone",
    "BlockTrace",
    "block_jacobian",
    "diagonal_jacobians",
    "trace_blocks",
    "FAMILIES",
    "HookTap",
    "LayerPaths",
    "collect_block_outputs",
    "find_layer_paths",
    "get_blocks",
    "hooked_blocks",
    "layer_paths",
    "truncated",
    "truncated_copy",
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
    "check_layer_outputs",
    "is_layer_outputs",
    "pool_tokens",
    "select_layers",
]
