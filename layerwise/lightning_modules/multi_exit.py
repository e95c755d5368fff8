"""The classic multi-exit baseline: a separate classifier at every layer."""

from typing import Any

import torch
from torch import Tensor, nn

from layerwise.engines.readout import Head, chunked_kl_divergence
from layerwise.features import FEATURES, IGNORE_INDEX, TARGETS, Backbone
from layerwise.lightning_modules.base import LayerwiseModule
from layerwise.lightning_modules.weights import LayerWeights, resolve_layer_weights


class MultiExit(LayerwiseModule):
    """Multi-exit training with one classifier (a copy of final norm + linear) per layer.

    Layers ``1..L-1`` get their own exit head, initialised as a copy of the model's head; layer ``L`` uses the
    model's own head, so there are ``L`` classifiers. Loss: ``Σ_l λ_l CE(head_l(h_l), y)``, plus, with
    ``distill_weight > 0``, ``distill_weight · T² · mean_{l<L} KL(softmax(z_L/T) || softmax(z_l/T))`` with the last
    exit's logits ``z_L`` detached (self-distillation of shallow exits towards the last layer).

    ``validation_step`` returns the shared head's readout per layer (the logit lens of the model's own head) and
    the separate heads' (``LayerOutputs.exit_readout``). For a language model every exit head is
    a copy of the final norm and the LM head, so this baseline costs ``(L-1)·V·d`` extra parameters — the cost the
    shared head avoids.

    Args:
        layer_weights: λ as in :class:`Aligned` (default ``"linear"``).
        distill_weight: weight of the KL distillation term (0 disables it).
        distill_temperature: temperature ``T`` of the distillation.
        backbone: the model, as in :class:`LayerwiseModule`.
        kwargs: the other options of :class:`LayerwiseModule` (``optimizer``, ``lr_scheduler``,
            ``scheduler_interval``, ``label_smoothing``, ``chunk_size``).
    """

    def __init__(
        self,
        backbone: Backbone,
        layer_weights: LayerWeights = "linear",
        distill_weight: float = 0.0,
        distill_temperature: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(backbone, **kwargs)
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

    def classifier_heads(self) -> list[Head]:
        """The exit head of every layer below the last, then the model's own head."""
        return [*self.exit_heads, self.backbone.head]

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        per_layer = self.layer_losses(outputs, range(self.num_layers))
        loss = (self.layer_weights.to(per_layer.dtype) * per_layer).sum()
        if self.distill_weight > 0:
            loss = loss + self.distill_weight * self.distillation(outputs)
        return loss

    def distillation(self, outputs: dict[str, Tensor]) -> Tensor:
        """``T² · mean_{l<L} KL(softmax(z_L/T) || softmax(z_l/T))`` with ``z_L`` detached, averaged over samples.

        For a language model, positions that predict nothing (target -100) are excluded.
        """
        features, targets = outputs[FEATURES], outputs[TARGETS]
        keep = targets != IGNORE_INDEX
        if not bool(keep.all()):
            features = features[:, keep]
        heads, temperature = self.classifier_heads(), self.distill_temperature
        kl = [
            chunked_kl_divergence(
                head, heads[-1], h, features[-1], temperature, self.chunk_size, self.backbone.token_level
            )
            for head, h in zip(heads[:-1], features[:-1])
        ]
        return temperature**2 * torch.stack(kl).mean()
