"""DETR with aligned auxiliary decoding losses (App. B.5 of Jiang et al.): weights λ_l on the decoder layers."""

import copy
from typing import Any, Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from layerwise._compat import built_by_lightning_cli
from layerwise.extras import require
from layerwise.features.hf import build_model
from layerwise.features.outputs import DETECTION_LABELS as LABELS
from layerwise.features.outputs import LAYER_BOXES, LAYER_LOGITS
from layerwise.lightning_modules.weights import LayerWeights, resolve_layer_weights


class DetrLayerwise(LightningModule):
    """Hugging Face ``DetrForObjectDetection`` trained with per-decoder-layer loss weights λ_l.

    DETR already decodes every decoder layer with the shared class and box heads (after the decoder's shared
    LayerNorm) and adds the same Hungarian-matched loss at each ("auxiliary decoding losses", uniform weights).
    The aligned objective weighs them: ``Σ_l λ_l · L · loss_l``, with λ from ``layer_weights`` (``linear``: λ_l =
    2l / (L(L+1)); ``uniform``: 1/L; or a list), scaled by L so that ``uniform`` is exactly DETR's own loss and
    ``linear`` has the same total weight. ``loss_l`` is the model's own detection loss (``model.loss_function``:
    class CE, L1 and GIoU box losses with the config's coefficients) of layer l's predictions.

    Evaluation returns every layer's predictions (``layer_logits`` (L, B, Q, C+1), ``layer_boxes`` (L, B, Q, 4),
    normalised cx, cy, w, h) with the batch's ``labels``: :class:`~layerwise.callbacks.DetectionLayerAP` turns them
    into AP50 per decoder layer.

    Args:
        model_name_or_path: a hub id or folder (``facebook/detr-resnet-50``); None builds a random model from
            ``config_overrides`` (a ``DetrConfig``).
        config_overrides: ``DetrConfig`` fields (e.g. ``num_labels``, ``decoder_layers``, a small ``backbone_config``).
        layer_weights: ``linear`` (aligned), ``uniform`` (DETR's own) or a list of L positive numbers.
        optimizer: optimizer factory (DETR: AdamW lr 1e-4, weight decay 1e-4).
        lr_scheduler: optional scheduler factory.
        backbone_lr_scale: the CNN backbone's learning rate relative to the rest (DETR: 0.1).
    """

    def __init__(
        self,
        model_name_or_path: Optional[str] = None,
        config_overrides: Optional[dict[str, Any]] = None,
        layer_weights: LayerWeights = "linear",
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        backbone_lr_scale: float = 0.1,
    ) -> None:
        super().__init__()
        if not 0.0 <= backbone_lr_scale:
            raise ValueError(f"`--model.init_args.backbone_lr_scale={backbone_lr_scale}` must be >= 0.")
        self.save_hyperparameters(ignore=[] if built_by_lightning_cli() else ["optimizer", "lr_scheduler"])
        transformers = require("transformers")
        overrides = dict(config_overrides or {})
        self.model = build_model(  # the one hub wrapper; without a name, DETR from its config (offline, random)
            transformers.AutoModelForObjectDetection,
            model_name_or_path,
            None if model_name_or_path else "detr",
            True,
            overrides,
            "--model.init_args",
        )
        self.model.config.auxiliary_loss = True  # the decoder returns every layer's output
        self.num_layers = int(self.model.config.decoder_layers)
        weights = resolve_layer_weights(layer_weights, self.num_layers, "--model.init_args.layer_weights")
        self.register_buffer("layer_weights", weights * self.num_layers, persistent=False)
        self.backbone_lr_scale = backbone_lr_scale
        self.optimizer_factory, self.lr_scheduler_factory = optimizer, lr_scheduler
        self._single_layer_config = copy.copy(self.model.config)
        self._single_layer_config.auxiliary_loss = False  # loss_function then scores one layer's predictions

    def layer_predictions(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """Every decoder layer's class logits (L, B, Q, C+1) and boxes (L, B, Q, 4), through the shared heads."""
        outputs = self.model.model(pixel_values=batch["pixel_values"], pixel_mask=batch.get("pixel_mask"))
        hidden = outputs.intermediate_hidden_states  # (L, B, Q, d), each after the decoder's shared LayerNorm
        return self.model.class_labels_classifier(hidden), self.model.bbox_predictor(hidden).sigmoid()

    def layer_losses(self, logits: Tensor, boxes: Tensor, labels: list[dict[str, Tensor]]) -> Tensor:
        """The model's own detection loss of every layer's predictions, (L,)."""
        labels = [{key: value.to(self.device) for key, value in target.items()} for target in labels]
        return torch.stack(
            [
                self.model.loss_function(logits[layer], labels, self.device, boxes[layer], self._single_layer_config)[0]
                for layer in range(self.num_layers)
            ]
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        logits, boxes = self.layer_predictions(batch)
        losses = self.layer_losses(logits, boxes, batch[LABELS])
        loss = (self.layer_weights.to(losses.dtype) * losses).sum()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch[LABELS]))
        self.log("train/loss_last", losses[-1], batch_size=len(batch[LABELS]))
        return loss

    @torch.no_grad()
    def _evaluation_step(self, batch: dict[str, Any], stage: str) -> dict[str, Any]:
        logits, boxes = self.layer_predictions(batch)
        losses = self.layer_losses(logits, boxes, batch[LABELS])
        self.log(f"{stage}/loss", losses[-1], prog_bar=True, sync_dist=True, batch_size=len(batch[LABELS]))
        return {LAYER_LOGITS: logits, LAYER_BOXES: boxes, LABELS: batch[LABELS]}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return self._evaluation_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return self._evaluation_step(batch, "test")

    def configure_optimizers(self) -> Any:
        backbone = [p for name, p in self.named_parameters() if "backbone" in name and p.requires_grad]
        others = [p for name, p in self.named_parameters() if "backbone" not in name and p.requires_grad]
        optimizer = self.optimizer_factory([{"params": others}, {"params": backbone}])
        for key in ("lr", "initial_lr"):
            if key in optimizer.param_groups[1]:
                optimizer.param_groups[1][key] *= self.backbone_lr_scale
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}
