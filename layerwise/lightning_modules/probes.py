"""Linear probes on frozen features: how much of a downstream task each layer of a trained model already carries."""

from typing import Any, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from layerwise._compat import built_by_lightning_cli
from layerwise.features import FEATURES, LOGITS, MAX_PROB, NLL, PREDICTIONS, TARGETS, Backbone
from layerwise.lightning_modules.base import EvaluationSteps
from layerwise.lightning_modules.checkpoint import load_module
from layerwise.metrics import readout_from_logits


class LinearProbes(EvaluationSteps, LightningModule):
    """A frozen backbone and one linear classifier per layer, all trained together in one pass (App. B.4).

    Task transfer: train a model on one task, then probe every layer's frozen feature on another (the paper trains
    on ImageNet and probes on CIFAR; offline, digits 0-4 then 5-9). Each step runs the backbone once without
    gradients and trains the L heads ``Linear(d, num_classes)`` on their own layer's feature with the summed
    cross-entropy (the heads do not interact, so this equals L separate probes). The backbone stays in evaluation
    mode (no dropout, frozen norms) also while fitting.

    Evaluation follows the analysis contract (``features``, ``logits`` = every probe's logits, ``targets``), so
    :class:`~layerwise.callbacks.LayerwiseAnalysis` reports the per-layer probe accuracy as ``accuracy`` — the
    per-layer table — next to the COS/CKA of the frozen features.

    Args:
        num_classes: classes of the downstream task.
        checkpoint: a ``layerwise fit`` checkpoint (``.ckpt``) whose backbone is probed.
        backbone: or the backbone itself (e.g. a pretrained ``TimmViT``/``HFEncoder``); exactly one of the two.
        optimizer: optimizer factory for the heads (default AdamW).
        lr_scheduler: optional scheduler factory.

    Logged: ``train/loss`` (summed over layers), ``train/acc`` (last layer), ``val/loss``, ``val/acc`` (last
    layer's probe).
    """

    def __init__(
        self,
        num_classes: int,
        checkpoint: Optional[str] = None,
        backbone: Optional[Backbone] = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
    ) -> None:
        super().__init__()
        if (checkpoint is None) == (backbone is None):
            raise ValueError("LinearProbes: give exactly one of `--model.init_args.checkpoint` and `backbone`.")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"`--model.init_args.num_classes={num_classes!r}` must be an integer >= 2.")
        self.save_hyperparameters(ignore=[] if built_by_lightning_cli() else ["backbone", "optimizer", "lr_scheduler"])
        if checkpoint is not None:
            backbone = load_module(checkpoint, option="--model.init_args.checkpoint").backbone
        if backbone.token_level:
            raise ValueError("LinearProbes probes classifiers (one feature per sample), not token-level models.")
        self.backbone = backbone.requires_grad_(False).eval()
        self.num_classes = num_classes
        self.probes = nn.ModuleList(nn.Linear(backbone.embed_dim, num_classes) for _ in range(backbone.num_layers))
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler

    def train(self, mode: bool = True) -> "LinearProbes":
        """Train the probes; the frozen backbone stays in evaluation mode."""
        super().train(mode)
        self.backbone.eval()
        return self

    @property
    def num_layers(self) -> int:
        """Number of probed layers L."""
        return self.backbone.num_layers

    def _features(self, batch: Any) -> tuple[Tensor, Optional[Tensor]]:
        inputs, targets = self.backbone.split_batch(batch)
        with torch.no_grad():
            features = self.backbone(inputs)
        return features, targets

    def probe_logits(self, features: Tensor) -> Tensor:
        """Every probe on its own layer: ``(L, B, d)`` -> ``(L, B, num_classes)``."""
        return torch.stack([probe(h.to(probe.weight.dtype)) for probe, h in zip(self.probes, features)])

    def forward(self, inputs: Any) -> Tensor:
        """The logits of every layer's probe ``(L, B, num_classes)``."""
        with torch.no_grad():
            features = self.backbone(inputs)
        return self.probe_logits(features)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        features, targets = self._features(batch)
        logits = self.probe_logits(features)
        losses = F.cross_entropy(logits.flatten(0, 1), targets.repeat(len(self.probes)), reduction="none")
        loss = losses.view(len(self.probes), -1).mean(dim=1).sum()
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", (logits[-1].argmax(-1) == targets).float().mean(), prog_bar=True)
        return loss

    @torch.no_grad()
    def layer_outputs(self, batch: Any) -> dict[str, Tensor]:
        """The analysis contract: frozen ``features``, every probe's ``logits`` and readout, ``targets``."""
        features, targets = self._features(batch)
        logits = self.probe_logits(features)
        readout = readout_from_logits(logits, targets)
        outputs = {FEATURES: features, LOGITS: logits, TARGETS: targets, PREDICTIONS: readout.predictions}
        return {**outputs, MAX_PROB: readout.max_prob, NLL: readout.nll}

    def setup(self, stage: str) -> None:
        data_classes = getattr(getattr(self.trainer, "datamodule", None), "num_classes", None)
        if data_classes is not None and data_classes != self.num_classes:
            raise ValueError(
                f"`--model.init_args.num_classes={self.num_classes}` but the data has {data_classes} classes; set "
                f"num_classes={data_classes}."
            )

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.probes.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}
