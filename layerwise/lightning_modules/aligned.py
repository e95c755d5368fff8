"""Aligned training: every layer is trained to be read out by the model's one shared head."""

from typing import Literal, Optional

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from layerwise.features import LOGITS, TARGETS, TimmViT
from layerwise.lightning_modules.base import LayerwiseModule
from layerwise.lightning_modules.weights import LayerWeights, resolve_layer_weights


class Aligned(LayerwiseModule):
    """Aligned loss ``Σ_l λ_l CE(head(h_l), y)`` with one shared head (Jiang, Zhou & Zhu, 2024).

    Args:
        backbone, optimizer, lr_scheduler, scheduler_interval, label_smoothing: see :class:`LayerwiseModule`.
        layer_weights: ``"linear"`` (λ_l = 2l/(L(L+1)), default), ``"uniform"`` (1/L) or an explicit list of ``L``
            positive weights (used as given).
    """

    def __init__(
        self,
        backbone: TimmViT,
        layer_weights: LayerWeights = "linear",
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(backbone, optimizer, lr_scheduler, scheduler_interval, label_smoothing)
        weights = resolve_layer_weights(layer_weights, backbone.num_layers, "--model.init_args.layer_weights")
        self.register_buffer("layer_weights", weights, persistent=False)

    def aligned_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """``Σ_l λ_l CE(head(h_l), y)``."""
        per_layer = self.cross_entropy(outputs[LOGITS], outputs[TARGETS])
        return (self.layer_weights.to(per_layer.dtype) * per_layer).sum()

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        return self.aligned_loss(outputs)
