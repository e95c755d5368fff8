"""Layer features of timm VisionTransformer / DeiT models, without hooks."""

import difflib
from typing import Optional

import torch
from torch import Tensor, nn

from layerwise.extras import require
from layerwise.features.backbone import Backbone
from layerwise.features.hooks import capture_block_call
from layerwise.features.paths import HeadSteps, layer_paths
from layerwise.features.pooling import Pooling, check_pooling, pool_tokens

_TIMM_POOL = {"cls": "token", "mean": "avg"}


class TimmViT(Backbone):
    """A timm VisionTransformer (ViT, DeiT) that returns the pooled feature of every layer.

    "The output of layer l" is the residual stream after block ``l`` (l = 1..L), before any final norm, pooled by
    ``pooling``. The *shared head* is the model's own final norm followed by its classifier; applied to the last
    layer it reproduces the model's own logits exactly (the model is built with the matching ``global_pool``).

    Args:
        model_name: any timm VisionTransformer/DeiT name, e.g. ``"deit_small_patch16_224"``.
        pretrained: load timm's pretrained weights (needs the hub; keep off offline).
        num_classes: classifier outputs.
        img_size: override the named architecture.
        patch_size: override the named architecture.
        in_chans: override the named architecture.
        embed_dim: override the named architecture.
        depth: override the named architecture.
        num_heads: override the named architecture.
        pooling: ``"cls"`` (the class token, default) or ``"mean"`` (average of the patch tokens).
        drop_rate: timm's dropout and stochastic-depth rates.
        drop_path_rate: timm's dropout and stochastic-depth rates.
        activation_checkpointing: recompute every block in the backward pass instead of keeping its activations
            (timm's ``set_grad_checkpointing``): less memory, one more forward per block.

    Shapes:
        ``forward(x)``: ``(B, C, H, W)`` -> ``(L, B, d)``; ``head(h)``: ``(..., d)`` -> ``(..., num_classes)``.
    """

    def __init__(
        self,
        model_name: str = "vit_tiny_patch16_224",
        pretrained: bool = False,
        num_classes: int = 1000,
        img_size: Optional[int] = None,
        patch_size: Optional[int] = None,
        in_chans: Optional[int] = None,
        embed_dim: Optional[int] = None,
        depth: Optional[int] = None,
        num_heads: Optional[int] = None,
        pooling: Pooling = "cls",
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        timm = require("timm")
        option = "--model.init_args.backbone.init_args"
        if not timm.is_model(model_name):
            close = difflib.get_close_matches(model_name, timm.list_models(), n=5, cutoff=0.5)
            raise ValueError(f"`{option}.model_name={model_name!r}` is not a timm model. Similar names: {close}.")
        check_pooling(pooling, f"{option}.pooling")
        if pooling not in _TIMM_POOL:
            raise ValueError(f"`{option}.pooling={pooling!r}`: vision transformers pool with 'cls' or 'mean'.")
        overrides = {
            "depth": depth,
            "embed_dim": embed_dim,
            "num_heads": num_heads,
            "img_size": img_size,
            "patch_size": patch_size,
            "in_chans": in_chans,
        }
        for name, value in overrides.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{option}.{name}={value!r}` must be a positive integer.")
        model = timm.create_model(
            model_name,
            pretrained=pretrained,
            num_classes=num_classes,
            global_pool=_TIMM_POOL[pooling],
            drop_rate=drop_rate,
            drop_path_rate=drop_path_rate,
            **{key: value for key, value in overrides.items() if value is not None},
        )
        if not hasattr(model, "forward_intermediates") or not hasattr(model, "blocks"):
            raise ValueError(f"`{option}.model_name={model_name!r}` is not a VisionTransformer-style timm model.")
        if activation_checkpointing:
            model.set_grad_checkpointing(True)
        self.model = model
        self.paths = layer_paths(model, f"{option}.model_name")
        self.pooling = pooling
        self.num_classes = num_classes
        self.num_layers = len(model.blocks)
        self.embed_dim = model.embed_dim

    def forward(self, x: Tensor) -> Tensor:
        """Pooled residual stream after every block: ``(L, B, d)``; one pass, gradients kept."""
        tokens = self.model.forward_intermediates(
            x, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True
        )
        pooled = [self._pool(patches, prefix) for patches, prefix in tokens]
        return torch.stack(pooled)

    def _pool(self, patches: Tensor, prefix: Optional[Tensor]) -> Tensor:
        if self.pooling == "cls":
            return prefix[:, 0]
        return pool_tokens(patches, "mean", num_prefix_tokens=0)

    def embed(self, x: Tensor) -> tuple[Tensor, None]:
        """Tokens entering block 1, ``(B, T, d)``, as the model's own forward computes them.

        Patch embedding, position embedding (with the prefix tokens), patch dropout, pre-norm: timm's
        ``forward_features`` runs up to the entry of block 1 and is stopped there. A ViT's blocks need no context.
        """
        args, kwargs = capture_block_call(self.model.blocks[0], lambda: self.model.forward_features(x))
        return (args[0] if args else kwargs["x"]), None

    def run_block(self, index: int, hidden: Tensor, context: None) -> Tensor:
        """Block ``index`` (0-based) of the ViT."""
        return self.model.blocks[index](hidden)

    def pool(self, hidden: Tensor, context: None) -> Tensor:
        """The pooled feature of a block's output ``(B, T, d)``, exactly as :meth:`forward` pools it."""
        prefix_tokens = self.model.num_prefix_tokens
        return self._pool(hidden[:, prefix_tokens:], hidden[:, :prefix_tokens] if prefix_tokens else None)

    def select(self, context: None, rows: Tensor) -> None:
        """No context to select from."""
        return None

    def head(self, h: Tensor) -> Tensor:
        """The model's own final norm + classifier, applied to features of any leading shape."""
        return HeadSteps(self.model, self.paths.shared_head)(h)

    def head_modules(self) -> nn.Module:
        """A fresh copy of the head (final norm + classifier), e.g. for a separate exit classifier per layer."""
        return HeadSteps(self.model, self.paths.shared_head).copy()
