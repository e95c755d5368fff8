"""Layer access: where the layers of a model live (one table), hooks on them, truncation, and the backbones."""

from layerwise.features.backbone import IGNORE_INDEX, Backbone
from layerwise.features.hf_causal_lm import HFCausalLM
from layerwise.features.hf_encoder import HFEncoder
from layerwise.features.hooks import HookTap, collect_block_outputs, hooked_blocks
from layerwise.features.jacobian import BlockTrace, block_jacobian, diagonal_jacobians, trace_blocks
from layerwise.features.layers import select_layers
from layerwise.features.mlp import MLPBackbone
from layerwise.features.outputs import FEATURES, TARGETS
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
    "FEATURES",
    "IGNORE_INDEX",
    "POOLINGS",
    "TARGETS",
    "Backbone",
    "HFCausalLM",
    "HFEncoder",
    "TimmViT",
    "pool_tokens",
    "select_layers",
]
