"""The classic multi-exit baseline: a separate classifier at every layer."""

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from layerwise.features import EXIT_LOGITS, TARGETS, TimmViT
from layerwise.lightning_modules.base import LayerwiseModule
from layerwise.lightning_modules.weights import LayerWeights, resolve_layer_weights


class MultiExit(LayerwiseModule):
    """Multi-exit training with one classifier (a copy of final norm + linear) per layer.

    Layers ``1..L-1`` get their own exit head, initialised as a copy of the model's head; layer ``L`` uses the
    model's own head, so there are ``L`` classifiers. Loss: ``Σ_l λ_l CE(head_l(h_l), y)``, plus, with
    ``distill_weight > 0``, ``distill_weight · T² · mean_{l<L} KL(softmax(z_L/T) || softmax(z_l/T))`` with the last
    exit's logits ``z_L`` detached (self-distillation of shallow exits towards the last layer).

    ``validation_step`` returns the shared head's logits per layer (``logits``, the logit lens of the model's own
    head) and the separate heads' logits (``exit_logits``).

    Args:
        layer_weights: λ as in :class:`Aligned` (default ``"linear"``).
        distill_weight: weight of the KL distillation term (0 disables it).
        distill_temperature: temperature ``T`` of the distillation.
        Others: see :class:`LayerwiseModule`.
    """

    def __init__(
        self,
        backbone: TimmViT,
        layer_weights: LayerWeights = "linear",
        distill_weight: float = 0.0,
        distill_temperature: float = 1.0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(backbone, optimizer, lr_scheduler, scheduler_interval, label_smoothing)
        if distill_weight < 0:
            raise ValueError(f"`--model.init_args.distill_weight={distill_weight}` must be >= 0.")
        if distill_temperature <= 0:
            raise ValueError(f"`--model.init_args.distill_temperature={distill_temperature}` must be > 0.")
        weights = resolve_layer_weights(layer_weights, backbone.num_layers, "--model.init_args.layer_weights")
        self.register_buffer("layer_weights", weights, persistent=False)
        self.exit_heads = nn.ModuleList(backbone.head_modules() for _ in range(backbone.num_layers - 1))
        self.distill_weight = distill_weight
        self.distill_temperature = distill_temperature

    @property
    def num_classifiers(self) -> int:
        """``L``: one exit head per layer below the last, plus the model's own head."""
        return len(self.exit_heads) + 1

    def layer_outputs(self, x: Tensor) -> dict[str, Tensor]:
        outputs = super().layer_outputs(x)
        features = outputs["features"]
        shallow = [head(feature) for head, feature in zip(self.exit_heads, features[:-1])]
        outputs[EXIT_LOGITS] = torch.stack([*shallow, outputs["logits"][-1]])
        return outputs

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        exit_logits, targets = outputs[EXIT_LOGITS], outputs[TARGETS]
        per_layer = self.cross_entropy(exit_logits, targets)
        loss = (self.layer_weights.to(per_layer.dtype) * per_layer).sum()
        if self.distill_weight > 0:
            loss = loss + self.distill_weight * self.distillation(exit_logits)
        return loss

    def distillation(self, exit_logits: Tensor) -> Tensor:
        """``T² · mean_{l<L} KL(softmax(z_L/T) || softmax(z_l/T))`` with ``z_L`` detached."""
        temperature = self.distill_temperature
        teacher = F.log_softmax(exit_logits[-1].detach() / temperature, dim=-1)
        students = F.log_softmax(exit_logits[:-1] / temperature, dim=-1)
        kl = F.kl_div(students, teacher.expand_as(students), log_target=True, reduction="none").sum(-1)
        return temperature**2 * kl.mean()
